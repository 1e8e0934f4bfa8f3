"""Suspects of the root-cause analysis: which one is reported first, and how they are described.

Module-level helpers of :mod:`torchparity.compare.rootcause`: the enclosing module of a module
record, the innermost culprit first, the ranking of the rest, and number formatting.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..results import Suspect


def _enclosing_module(recs: Any, i: int) -> int | None:
    """For a module-level record, the position of its parent module's record of the same phase
    (the call that encloses it); None for other levels and for a top-level module."""
    row = recs.iloc[i]
    if row.get("level") != "module":
        return None
    mod = str(row.get("module") or "")
    if "." not in mod:
        return None
    parent = mod.rsplit(".", 1)[0]
    hit = np.flatnonzero((recs["module"].astype(str).to_numpy(dtype=object) == parent)
                         & (recs["phase"].to_numpy(dtype=object) == row.get("phase"))
                         & (recs["level"].to_numpy(dtype=object) == "module"))
    if not len(hit):
        return None
    order = recs["order"].to_numpy()
    after = hit[order[hit] >= order[i]]  # a parent's record is written when its call returns
    return int(after[0]) if len(after) else int(hit[-1])


def _in_subtree(module: str, parent: str) -> bool:
    return not parent or module == parent or module.startswith(parent + ".")


def _prefer_inner(suspects: list[Suspect]) -> list[Suspect]:
    """The innermost culprit first.

    A module record contains the ops that ran inside it: when the earliest suspect is a module
    record (or a module's suspect records come before their inner ops, as backward module
    records do), the earliest suspect op of the same phase inside that module's subtree is the
    more precise culprit. API and aten records are never replaced by a module record.
    """
    if len(suspects) < 2 or suspects[0].level != "module" or suspects[0].kind != "op":
        return suspects
    top = suspects[0]
    inner = [s for s in suspects[1:] if s.phase == top.phase and s.level != "module" and s.kind == "op"
             and _in_subtree(s.module, top.module)]
    if not inner:
        # at module level alone: the innermost suspect module inside the top one
        inner = [s for s in suspects[1:] if s.phase == top.phase and s.kind == "op" and s.module != top.module
                 and top.module != "" and _in_subtree(s.module, top.module)]
        inner.sort(key=lambda s: (-s.module.count("."), s.index))
    if inner:
        first = inner[0]
        return [first] + [s for s in suspects if s is not first]
    return suspects


def rank_suspects(suspects: list[Suspect], limit: int = 50) -> list[Suspect]:
    """Best first: the root cause (earliest), then the others by score."""
    if not suspects:
        return []
    head, rest = suspects[0], suspects[1:]
    rest = sorted(rest, key=lambda s: (-_finite(s.score), s.index))
    return [head] + rest[: limit - 1]


def _finite(x: float) -> float:
    return 1e300 if math.isinf(x) or math.isnan(x) else x


def _isnan(x: Any) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x))
    except TypeError:
        return False


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"
