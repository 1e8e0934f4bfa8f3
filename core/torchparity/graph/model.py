"""The graph data model: module and op nodes, and how verdicts aggregate up the hierarchy."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .colours import DEFAULT_BANDS, band_of, legend

#: node status, worst last; a module's colour is the worst status below it
VERDICT_RANK = {"none": 0, "skip": 0, "pass": 1, "warning": 2, "error": 3, "overflow": 4}
STATUSES = ("pass", "warning", "error", "overflow", "unmatched", "none")


def worse(a: str, b: str) -> str:
    """The worse of two verdicts (pass < warning < error < overflow)."""
    return a if VERDICT_RANK.get(a, 0) >= VERDICT_RANK.get(b, 0) else b


@dataclass
class Node:
    """One node of the hierarchy: a module (from modules.jsonl) or an op record under it.

    ``verdict`` is the node's own judgement (its records' rows), ``status`` the colour shown:
    ``unmatched`` for a node present on one side only, else the worst verdict of the node and
    its descendants (``none`` when nothing was judged)."""

    id: str
    name: str
    kind: str  # module | op
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    module: str = ""
    module_class: str | None = None
    op: str | None = None
    phase: str | None = None
    level: str | None = None
    order: int = 0  # execution order of the node's first record
    side: str = "both"  # both | device | bench (present on that side only)
    bench_name: str | None = None
    tensors: list[dict[str, Any]] = field(default_factory=list)  # device side (or the only side)
    bench_tensors: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)  # module nodes: their module records
    metrics: list[dict[str, Any]] = field(default_factory=list)  # compare rows of this node
    stack: list[str] = field(default_factory=list)
    verdict: str = "none"
    error: float | None = None
    amplification: float | None = None
    overflow: str | None = None  # critical | high | medium
    reason: str | None = None
    status: str = "none"
    worst: str = "none"  # worst verdict of the node and its descendants
    worst_error: float | None = None
    n_error: int = 0  # own + descendants, counted on op/module-record level
    n_warning: int = 0
    n_unmatched: int = 0
    n_overflow: int = 0
    root_cause: bool = False
    on_root_path: bool = False
    precision_index: float | None = None  # own, in [0, 1] (see graph.colours); None: not compared
    worst_index: float | None = None  # the largest precision index of the node and its descendants
    band: int | None = None  # colour band of worst_index (0 = lightest); None: no index
    manual: bool = False  # paired by a manual match (page or --match-file), not by compare

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Graph:
    """A rebuilt hierarchy. ``nodes`` by id; ``root`` is the model node ("M:")."""

    nodes: dict[str, Node]
    root: str
    mode: str  # build | compare
    step: int
    rank: int
    device_dump: str = ""
    bench_dump: str | None = None
    root_cause: str | None = None  # node id
    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    bands: tuple[float, ...] = DEFAULT_BANDS  # upper bounds of the colour bands below 1
    matches: dict[str, Any] = field(default_factory=dict)  # manual matches applied (match-file format)

    def node(self, key: str) -> Node:
        """A node by id, module path (``layers.0.mlp``) or record name (``Tensor.add.0.forward``)."""
        for cand in (key, f"M:{key}", f"R:{key}", f"B:{key}"):
            if cand in self.nodes:
                return self.nodes[cand]
        raise KeyError(key)

    def path_to(self, node_id: str) -> list[str]:
        """Ids from the root down to ``node_id``."""
        out: list[str] = []
        cur: str | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.nodes[cur].parent
        return out[::-1]

    def aggregate(self) -> None:
        """Fill status/worst_error/counts bottom-up and mark the root cause's path."""

        def visit(nid: str) -> None:
            n = self.nodes[nid]
            n.children.sort(key=lambda c: (self.nodes[c].order, c))
            worst = "overflow" if n.overflow in ("critical", "high") else n.verdict
            werr = _finite(n.error)
            widx = n.precision_index
            n.n_error = int(n.verdict == "error")
            n.n_warning = int(n.verdict == "warning")
            n.n_unmatched = int(n.side != "both" and self.mode == "compare")
            n.n_overflow = int(n.overflow in ("critical", "high"))
            for c in n.children:
                visit(c)
                ch = self.nodes[c]
                worst = worse(worst, ch.worst)
                ce = _finite(ch.worst_error)
                if ce is not None and (werr is None or ce > werr):
                    werr = ce
                if ch.worst_index is not None and (widx is None or ch.worst_index > widx):
                    widx = ch.worst_index
                n.n_error += ch.n_error
                n.n_warning += ch.n_warning
                n.n_unmatched += ch.n_unmatched
                n.n_overflow += ch.n_overflow
            n.worst_error = werr
            n.worst_index = widx
            n.band = band_of(widx, self.bands)
            n.worst = worst if worst != "skip" else "none"
            n.status = "unmatched" if (n.side != "both" and self.mode == "compare") else n.worst

        visit(self.root)
        if self.root_cause is not None and self.root_cause in self.nodes:
            self.nodes[self.root_cause].root_cause = True
            for nid in self.path_to(self.root_cause):
                self.nodes[nid].on_root_path = True

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON-able dict (NaN -> null, Inf -> "Infinity")."""
        return jsonable({
            "format": "torchparity-graph", "version": 1, "mode": self.mode, "step": self.step, "rank": self.rank,
            "device_dump": self.device_dump, "bench_dump": self.bench_dump, "root": self.root,
            "root_cause": self.root_cause, "summary": self.summary, "warnings": self.warnings,
            "legend": [b.to_dict() for b in legend(self.bands)], "matches": self.matches,
            "nodes": {k: v.to_dict() for k, v in self.nodes.items()},
        })


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else (v if math.isinf(v) else None)


def jsonable(x: Any) -> Any:
    """Strict-JSON value: numpy scalars unwrapped, NaN -> None, Inf -> the dump format's strings."""
    if hasattr(x, "item") and not isinstance(x, (list, dict, str, tuple)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return x
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)
