"""The search of the precision bisect: the smallest set of units whose promotion removes a divergence.

Pure Python, no torch: ``fixes(units)`` is the experiment (one re-run with those units promoted,
True when the divergence is gone). The search is adaptive group testing over an ordered list of
units (modules in execution order, or ops):

1. binary search for the shortest prefix ``units[:k]`` whose promotion (with the culprits already
   found) fixes the run: ``units[k-1]`` is a culprit (log2 N re-runs);
2. re-run with the culprits found so far alone: if that fixes, done (1 re-run); otherwise the
   remaining culprits are in ``units[:k-1]``: search again there.

One culprit costs about ``log2 N + 1`` re-runs, ``c`` culprits ``c (log2 N + 1)``; a divergence
spread over many units (every block's rounding adding up) would need a re-run count that grows
with N, so the search stops after ``max_culprits`` of them (:class:`Diffuse`). It assumes that
promoting more never brings a removed divergence back (monotonicity); every answer it gives was
verified by a re-run (or is the full set, itself verified), so it never reports an unverified set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence


@dataclass
class Probe:
    """One re-run of the search: which units were promoted, the error, and whether it fixed."""

    level: str
    promoted: list[str]
    error: float
    fixed: bool

    def to_dict(self) -> dict:
        n = len(self.promoted)
        shown = self.promoted if n <= 6 else [*self.promoted[:3], f"... ({n - 5} more)", *self.promoted[-2:]]
        return {"level": self.level, "n_promoted": n, "promoted": shown, "error": self.error, "fixed": self.fixed}


@dataclass
class SearchResult:
    culprits: list[Hashable]
    probes: list[Probe] = field(default_factory=list)


class Diffuse(Exception):
    """More than ``max_culprits`` units are needed: the divergence is spread over many of them.
    ``found`` holds the culprits found so far (each one needed with the ones before it)."""

    def __init__(self, found: list) -> None:
        super().__init__(f"{len(found)} culprits found and more needed")
        self.found = found


def minimal_set(units: Sequence[Hashable], fixes: Callable[[list], bool], max_culprits: int | None = None) -> list:
    """The culprits among ``units``: a small set whose promotion fixes the run.

    Preconditions (checked by the caller with real re-runs): promoting all ``units`` fixes, promoting
    none does not. ``fixes`` is called at most ``c * (ceil(log2 N) + 1)`` times for ``c`` culprits;
    with ``max_culprits``, :class:`Diffuse` is raised once that many are found and do not suffice
    (so at most ``max_culprits * (ceil(log2 N) + 1)`` calls).
    """
    rest = list(units)
    must: list = []
    hi = len(rest)  # invariant: must + rest[:hi] fixes; must alone does not
    while hi > 0:
        lo = 0  # must + rest[:lo] does not fix
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fixes(must + rest[:mid]):
                hi = mid
            else:
                lo = mid
        must.append(rest[hi - 1])
        rest = rest[:hi - 1]
        if not rest or fixes(list(must)):  # with nothing left, must is the known-fixing set itself
            break
        if max_culprits is not None and len(must) >= max_culprits:
            raise Diffuse(must)
        hi = len(rest)
    return must
