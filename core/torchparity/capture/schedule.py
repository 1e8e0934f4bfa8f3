"""When a tool works fully, lightly or not at all: ``steps``, ``every`` and ``light``, shared by
the dump (:class:`~torchparity.capture.options.DumpOptions`) and the NaN/Inf tracker."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

#: what the steps between full steps may do (``light``); None: nothing
LIGHT_TIERS = (None, "module")


def check_schedule(steps: Any, every: Any, light: Any, full: str = "full capture") -> list[int] | None:
    """Validate ``steps``, ``every`` and ``light`` (one-line errors naming the option); returns
    ``steps`` as a list (None: every step). ``full`` names what a full step does, in the errors."""
    if steps is not None:
        seq = list(steps) if not isinstance(steps, (str, bytes)) and hasattr(steps, "__iter__") else None
        if seq is None or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seq):
            raise UsageError(f"steps must be a list of step numbers >= 0 (got {steps!r})")
        steps = seq
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise UsageError(f"every must be a whole number >= 1 ({full} on steps 0, N, 2N, ...; got {every!r})")
    if light not in LIGHT_TIERS:
        raise UsageError(f"light must be one of {', '.join(t for t in LIGHT_TIERS if t)} or None "
                         f"(what the steps between full ones do; got {light!r})")
    if light is not None and every is None and steps is None:
        raise UsageError(f"light={light!r} is for the steps without {full}; give every=N or steps=[...] too")
    return steps


def tier_of(step: int, steps: Any, every: int | None, light: str | None) -> str | None:
    """What step ``step`` gets: ``"full"`` (in ``steps``, if given, and a multiple of ``every``,
    if given), ``"light"`` (any other step, with ``light``) or None (nothing)."""
    if (steps is None or step in steps) and (every is None or step % every == 0):
        return "full"
    return "light" if light is not None else None
