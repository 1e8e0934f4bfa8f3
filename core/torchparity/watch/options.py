"""``WatchOptions``: what ``torchparity.watch`` is told, checked once (bad input is one line)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

#: the exit code of ``on_trigger="exit"`` (configurable with ``exit_code=``)
EXIT_CODE = 3
ON_TRIGGER = ("raise", "continue", "exit")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value: Any, option: str = "memory_budget") -> int:
    """``2GiB``, ``500MB``, ``1e9`` or an int -> bytes (one-line error naming ``option``)."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, (int, float)) and value > 0:
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            try:
                n = float(m.group(1)) * _UNITS[m.group(2).lower()]
            except ValueError:
                n = 0
            if n > 0:
                return int(n)
    raise UsageError(f"watch: {option} must be a positive size such as 2GiB, 500MB or a number of bytes (got {value!r:.60})")


@dataclass
class WatchOptions:
    """The watchdog's settings (see docs/watch.md)."""

    output_dir: Path
    every: int = 10  # snapshot every K steps; the last K steps' batches and RNG states are kept
    # a snapshot may cost at most this share of the steps between two: when it costs more (and more
    # than 50 ms), the snapshots are spaced further apart (up to 10 x every); None: exactly every K
    snapshot_share: float | None = 0.02
    window: int = 20  # running window of losses / gradient norms for the spike triggers
    min_window: int = 5  # spikes are judged once the window holds this many steps
    loss_spike: float | None = 10.0  # trigger when loss > loss_spike * max(|loss| in the window)
    grad_spike: float | None = 10.0  # trigger when grad norm > grad_spike * max(window)
    memory_budget: int = 2 * 1024**3  # host bytes for the snapshot and the kept batches
    on_trigger: str = "raise"
    exit_code: int = EXIT_CODE
    reference: str | None = None  # online-compare reference backend for the re-run, e.g. "cpu"
    max_triggers: int = 1  # confirm at most this many triggers (later ones are logged only)

    @classmethod
    def make(cls, output_dir: Any, **kw: Any) -> "WatchOptions":
        if output_dir is None or not isinstance(output_dir, (str, Path)) or str(output_dir) == "":
            raise UsageError(f"watch: output_dir must be a directory path (got {output_dir!r:.60})")
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise UsageError(f"watch: output_dir {out} is a file; give a directory")
        for name in ("every", "window", "min_window", "max_triggers"):
            v = kw.get(name, getattr(cls, name))
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"watch: {name} must be a whole number >= 1 (got {v!r:.40})")
        for name in ("loss_spike", "grad_spike"):
            v = kw.get(name, getattr(cls, name))
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 1):
                raise UsageError(f"watch: {name} must be a factor > 1, or None to turn that trigger off (got {v!r:.40})")
        share = kw.get("snapshot_share", cls.snapshot_share)
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1):
            raise UsageError(f"watch: snapshot_share must be a fraction between 0 and 1 (0.02: 2 %), or None to "
                             f"snapshot exactly every K steps (got {share!r:.40})")
        if "memory_budget" in kw:
            kw["memory_budget"] = parse_bytes(kw["memory_budget"])
        on = kw.get("on_trigger", cls.on_trigger)
        if on not in ON_TRIGGER:
            raise UsageError(f"watch: on_trigger must be one of {', '.join(ON_TRIGGER)} (got {on!r:.40})")
        code = kw.get("exit_code", EXIT_CODE)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 256:
            raise UsageError(f"watch: exit_code must be a whole number from 1 to 255 (got {code!r:.40})")
        ref = kw.get("reference")
        if ref is not None:
            from ..plugins import get_registry

            names = sorted(get_registry().backends)
            if ref not in names:
                raise UsageError(f"watch: unknown reference backend {ref!r:.40}; installed: {', '.join(names)}")
        try:
            return cls(output_dir=out, **kw)
        except TypeError as exc:
            raise UsageError(f"watch: unknown option ({exc})") from None
