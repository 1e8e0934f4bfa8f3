"""Rebuild the module/op hierarchy of one (step, rank) of a dump."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from ..errors import DumpError, UsageError
from .model import Graph, Node, jsonable

log = logging.getLogger(__name__)

#: per-tensor fields kept in a node (the details pane shows them)
TENSOR_FIELDS = ("io", "arg", "kind", "dtype", "shape", "max", "min", "mean", "norm", "nan", "inf", "value", "md5")


def module_id(path: str) -> str:
    return f"M:{path}"


def _clean(v: Any) -> Any:
    """A frame cell as a plain value: missing (None, NaN, pandas' NA) -> None, tuples -> lists."""
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if type(v).__name__ in ("NAType", "NaTType"):  # pandas.NA / NaT: missing in nullable columns
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


def _tensor_summary(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: _clean(row.get(k)) for k in TENSOR_FIELDS if k in row}
    return {k: v for k, v in out.items() if v is not None}


def _read(dump: str | os.PathLike[str], step: int, rank: int) -> tuple[Any, list[dict[str, Any]], dict[int, list[str]], list[str]]:
    """(rows as dicts, module list, stacks, warnings) of one unit."""
    from ..dump.reader import open_dump, read_unit

    reader = open_dump(dump)
    warnings = list(reader.warnings)
    unit = reader.unit(step, rank)
    frame = read_unit(unit, warnings)
    return frame, reader.modules(step, rank), reader.stacks(step, rank), warnings


def _overflow_levels(frame: Any) -> dict[int, tuple[str, str]]:
    """record_id -> (overflow level, reason) from the ``overflow`` checker plugin; a plain NaN/Inf
    count classification when the plugin is not installed."""
    try:
        from ..plugin_types import CheckContext
        from ..plugins import get_registry

        checker = get_registry().get("checker", "overflow")
        res = checker.scan_dump(frame, CheckContext(mode="statistics"))
        out = {}
        for rid, lvl, reason in zip(res["record_id"], res["level"], res["reason"]):
            if isinstance(lvl, str) and lvl:
                out[int(rid)] = (lvl, str(reason or ""))
        return out
    except Exception as exc:  # noqa: BLE001 - the plugin is optional; fall back to the counts
        log.debug("overflow checker unavailable (%s); using NaN/Inf counts", exc)
    bad_in: dict[int, bool] = {}
    bad_out: dict[int, bool] = {}
    for rid, io, nan, inf in zip(frame["record_id"], frame["io"], frame["nan"], frame["inf"]):
        bad = any(isinstance(x, (int, float)) and not math.isnan(x) and x > 0 for x in (nan, inf))
        d = bad_out if io == "output" else bad_in
        d[int(rid)] = d.get(int(rid), False) or bad
    out = {}
    for rid in set(bad_in) | set(bad_out):
        i, o = bad_in.get(rid, False), bad_out.get(rid, False)
        if o and not i:
            out[rid] = ("critical", "finite inputs, non-finite output")
        elif o and i:
            out[rid] = ("high", "non-finite inputs and output")
        elif i:
            out[rid] = ("medium", "non-finite inputs, finite output")
    return out


def _ensure_module(nodes: dict[str, Node], path: str, cls: str | None = None, side: str = "both") -> str:
    """The id of the node for module ``path``, creating it (and missing ancestors) when needed."""
    nid = module_id(path)
    if nid in nodes:
        return nid
    parent = None
    if path:
        parent_path = path.rsplit(".", 1)[0] if "." in path else ""
        parent = _ensure_module(nodes, parent_path, side=side)
    nodes[nid] = Node(id=nid, name=path or "(model)", kind="module", parent=parent, module=path,
                      module_class=cls, side=side, order=1 << 60)
    if parent is not None:
        nodes[parent].children.append(nid)
    return nid


def build_from_frame(frame: Any, modules: list[dict[str, Any]], stacks: dict[int, list[str]],
                     side: str = "both", op_prefix: str = "R:") -> tuple[dict[str, Node], dict[int, str]]:
    """Nodes of one unit and a record_id -> node id map."""
    nodes: dict[str, Node] = {}
    _ensure_module(nodes, "", None, side)
    for m in modules:  # modules.jsonl: first-seen order, parents before children
        path = str(m.get("path") or "")
        parent = m.get("parent")
        nid = module_id(path)
        if nid not in nodes:
            if parent is not None and module_id(str(parent)) in nodes:
                nodes[nid] = Node(id=nid, name=path, kind="module", parent=module_id(str(parent)), module=path,
                                  module_class=m.get("class"), side=side, order=1 << 60)
                nodes[module_id(str(parent))].children.append(nid)
            else:
                _ensure_module(nodes, path, m.get("class"), side)
        nodes[nid].module_class = m.get("class") or nodes[nid].module_class
    if nodes[module_id("")].module_class:
        nodes[module_id("")].name = f"(model) {nodes[module_id('')].module_class}"

    rec_node: dict[int, str] = {}
    records: dict[int, dict[str, Any]] = {}
    for row in frame.to_dict("records"):
        rid = int(row["record_id"])
        rec = records.get(rid)
        if rec is None:
            rec = records[rid] = {k: row.get(k) for k in ("name", "op", "level", "phase", "module", "module_class",
                                                         "call_index", "stack")}
            rec["tensors"] = []
        if isinstance(_clean(row.get("io")), str):
            rec["tensors"].append(_tensor_summary(row))
    for rid in sorted(records):
        rec = records[rid]
        path = str(_clean(rec["module"]) or "")
        mid = _ensure_module(nodes, path, _clean(rec["module_class"]), side)
        mod = nodes[mid]
        mod.order = min(mod.order, rid)
        stack_id = _clean(rec["stack"])
        frames = stacks.get(int(stack_id), []) if isinstance(stack_id, (int, float)) else []
        if rec["level"] == "module":
            mod.calls.append({"name": rec["name"], "phase": rec["phase"], "record_id": rid,
                              "tensors": rec["tensors"], "stack": frames})
            if not mod.stack:
                mod.stack = frames
            rec_node[rid] = mid
            continue
        nid = f"{op_prefix}{rec['name']}"
        if nid in nodes:  # names are unique per step and rank; be safe with odd dumps
            nid = f"{nid}#{rid}"
        nodes[nid] = Node(id=nid, name=str(rec["name"]), kind="op", parent=mid, module=path,
                          module_class=_clean(rec["module_class"]), op=str(rec["op"]), phase=_clean(rec["phase"]),
                          level=_clean(rec["level"]), order=rid, side=side, tensors=rec["tensors"], stack=frames)
        mod.children.append(nid)
        rec_node[rid] = nid
    for rid, (lvl, reason) in _overflow_levels(frame).items():
        nid = rec_node.get(rid)
        if nid is None:
            continue
        n = nodes[nid]
        if n.overflow is None or ("medium", "high", "critical").index(lvl) > ("medium", "high", "critical").index(n.overflow):
            n.overflow, n.reason = lvl, n.reason or reason
    _propagate_order(nodes, module_id(""))
    return nodes, rec_node


def _propagate_order(nodes: dict[str, Node], nid: str) -> int:
    n = nodes[nid]
    for c in n.children:
        n.order = min(n.order, _propagate_order(nodes, c))
    return n.order


def _check_args(step: int, rank: int) -> None:
    for name, v in (("step", step), ("rank", rank)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise UsageError(f"{name} must be a non-negative integer, got {v!r}")


def build_graph(dump: str | os.PathLike[str], step: int = 0, rank: int = 0) -> Graph:
    """Rebuild the module/op hierarchy of one (step, rank) of ``dump``.

    Module nodes come from ``modules.jsonl`` (or the records' module paths), op records hang
    under the innermost module they ran in (forward and backward alike, each with its phase),
    module-level records become the ``calls`` of their module node. Ops whose outputs turned
    non-finite are marked with an overflow level (critical/high/medium).
    """
    _check_args(step, rank)
    frame, modules, stacks, warnings = _read(dump, step, rank)
    if not len(frame):
        raise DumpError(f"{dump} step {step} rank {rank} holds no records; dump with level 'module', 'mix' or 'api'")
    nodes, _ = build_from_frame(frame, modules, stacks)
    g = Graph(nodes=nodes, root=module_id(""), mode="build", step=step, rank=rank, device_dump=str(dump),
              warnings=warnings)
    g.aggregate()
    g.summary = jsonable({"records": int(frame["record_id"].nunique()), "nodes": len(nodes),
                          "modules": sum(1 for n in nodes.values() if n.kind == "module"),
                          "overflow": sum(1 for n in nodes.values() if n.overflow is not None),
                          "critical": sum(1 for n in nodes.values() if n.overflow == "critical")})
    return g
