"""Majority vote across data-parallel replicas, and the finding it produces.

Every data-parallel replica must hold bitwise the same value for each compared quantity (a
parameter's gradient after the all-reduce, the parameter after the optimizer step). For each
quantity the ranks are grouped by the value they hold; the group larger than half the ranks is
the majority and every other rank is named. When no group is larger than half (two replicas
that disagree, 2 against 2, all different) there is no majority, and the finding says so instead
of guessing which rank is wrong.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Mapping

#: what a finding is about: the gradient after the all-reduce, the parameter after the step, or
#: (offline, from an aten dump) a tensor of an optimizer-phase op
#: (offline, module level) a parameter as the forward used it
KINDS = ("grad", "param", "optimizer", "param_in")


@dataclass
class ReplicaFinding:
    """One quantity whose replicas disagree at one step.

    ``ranks``: the ranks whose value differs from the majority (every rank when there is no
    majority); ``majority``: the ranks that agree (empty without a majority); ``values``: what
    each rank holds, as written to files (a hash in hex, an md5, statistics).
    """

    step: int
    kind: str  # grad | param | optimizer
    name: str  # parameter name (or record name and argument, offline from an aten dump)
    ranks: list[int]
    majority: list[int]
    no_majority: bool
    values: dict[int, Any] = field(default_factory=dict)
    source: str = "hash"  # hash | md5 | stats | tensor | gradstats
    since: int | None = None  # the step this parameter's replica first differed (when earlier)

    def describe(self) -> str:
        """One line: step, kind, name and the rank(s)."""
        what = {"grad": "gradient after the all-reduce", "param": "parameter after the optimizer step",
                "param_in": "parameter at the forward (after the previous update)",
                "optimizer": "optimizer-phase tensor"}.get(self.kind, self.kind)
        if self.no_majority:
            groups = _groups(self.values)
            text = " vs ".join("rank" + ("s " if len(g) > 1 else " ") + ",".join(map(str, g)) for g in groups)
            line = f"step {self.step}: {what} {self.name}: replicas disagree with no majority ({text})"
        else:
            rk = "rank" + ("s " if len(self.ranks) > 1 else " ") + ",".join(map(str, self.ranks))
            line = (f"step {self.step}: {what} {self.name}: {rk} differ"
                    f"{'s' if len(self.ranks) == 1 else ''} from the majority "
                    f"({len(self.majority)} of {len(self.majority) + len(self.ranks)} ranks agree)")
        if self.since is not None and self.since < self.step:
            line += f" [differs since step {self.since}]"
        return line

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["values"] = {str(k): v for k, v in self.values.items()}
        d["message"] = self.describe()
        return d


def _groups(values: Mapping[int, Any]) -> list[list[int]]:
    """Ranks grouped by equal value, largest group first (then lowest rank)."""
    by: dict[Hashable, list[int]] = {}
    for r in sorted(values):
        by.setdefault(_key(values[r]), []).append(r)
    return sorted(by.values(), key=lambda g: (-len(g), g[0]))


def _key(v: Any) -> Hashable:
    if isinstance(v, dict):
        return tuple(sorted((k, _key(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_key(x) for x in v)
    if isinstance(v, float) and v != v:  # NaN equals NaN here: the same bits were written
        return ("nan",)
    return v


def vote(step: int, kind: str, name: str, values: Mapping[int, Any], source: str = "hash") -> ReplicaFinding | None:
    """The finding for one quantity (None when every rank holds the same value)."""
    if len(values) < 2:
        return None
    counts = Counter(_key(v) for v in values.values())
    if len(counts) == 1:
        return None
    top, n = counts.most_common(1)[0]
    vals = {int(r): values[r] for r in sorted(values)}
    if n * 2 > len(values):
        majority = [r for r in vals if _key(vals[r]) == top]
        ranks = [r for r in vals if _key(vals[r]) != top]
        return ReplicaFinding(step, kind, name, ranks, majority, False, vals, source)
    return ReplicaFinding(step, kind, name, sorted(vals), [], True, vals, source)
