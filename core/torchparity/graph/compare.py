"""Compare two dumps node by node: :func:`torchparity.compare` judges, the graph shows where."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

from .build import _check_args, _ensure_module, _read, build_from_frame, module_id
from .colours import check_bands, precision_index
from .matches import Matches, load_matches, manual_metrics
from .model import Graph, Node, jsonable, worse

#: compare-row columns kept per tensor in a node's ``metrics`` (NaN ones dropped)
METRIC_COLUMNS = (
    "tensor", "io", "match", "verdict", "error", "amplification", "reason", "checker",
    "device_dtype", "bench_dtype", "device_shape", "bench_shape",
    "max_diff", "min_diff", "mean_diff", "norm_diff", "max_rel_diff", "min_rel_diff", "mean_rel_diff", "norm_rel_diff",
    "device_nan", "bench_nan", "device_inf", "bench_inf",
    "cosine", "max_abs_err", "max_rel_err", "rmse", "euc_dist", "one_thousandth_ratio", "five_thousandth_ratio",
    "rel_l2", "md5_equal", "device_md5", "bench_md5",
)


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _rid(x: Any) -> int | None:
    v = _num(x)
    return None if v is None or v < 0 else int(v)  # compare writes -1 for "no record on this side"


def _metric(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for c in METRIC_COLUMNS:
        if c not in row:
            continue
        v = row[c]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[c] = list(v) if isinstance(v, tuple) else v
    if out.get("verdict") in ("pass", "skip"):  # the sentence matters on warnings and errors only
        out.pop("reason", None)
        out.pop("checker", None)
    for c in ("device_nan", "bench_nan", "device_inf", "bench_inf"):
        if out.get(c) == 0:
            out.pop(c)
    return jsonable(out)


def compare_graphs(device_dump: str | os.PathLike[str], bench_dump: str | os.PathLike[str], step: int = 0,
                   rank: int = 0, layer_mapping: str | os.PathLike[str] | Mapping[str, str] | None = None,
                   plugins: Any = None, threshold: float | None = None, *,
                   matches: str | os.PathLike[str] | Mapping[str, Any] | Matches | None = None,
                   bands: Any = None) -> Graph:
    """The device dump's hierarchy with every node judged against the bench dump.

    Runs :func:`torchparity.compare` for (step, rank) and attaches to each op node its verdict,
    worst error and amplification (module nodes: their module records'), then aggregates up the
    tree (a module's status is the worst below it). Records and modules found on one side only
    are added with ``side`` ``device``/``bench`` and status ``unmatched``; the root cause and its
    ancestors are marked. Every compared node gets a precision index and a colour band
    (:mod:`torchparity.graph.colours`; ``bands`` overrides the band bounds).

    ``matches`` (a match file exported from the page, or a dict/:class:`Matches`): its module
    pairs join the layer mapping; its record pairs join two unmatched records (statistics shown,
    no verdict).
    """
    from ..compare.api import compare
    from ..compare.matching import load_layer_mapping, map_module

    _check_args(step, rank)
    try:
        bands = check_bands(bands)
    except ValueError as exc:
        from ..errors import UsageError

        raise UsageError(f"colour bands: {exc}") from None
    manual = load_matches(matches)
    mapping = {**load_layer_mapping(layer_mapping), **manual.modules}
    kwargs: dict[str, Any] = {}
    if threshold is not None:
        kwargs["threshold"] = threshold
    res = compare(device_dump, bench_dump, step=step, rank=rank, layer_mapping=mapping or None, plugins=plugins,
                  **kwargs)
    dframe, dmods, dstacks, dwarn = _read(device_dump, step, rank)
    bframe, bmods, bstacks, bwarn = _read(bench_dump, step, rank)
    nodes, dnode = build_from_frame(dframe, dmods, dstacks)
    bnodes, bnode = build_from_frame(bframe, bmods, bstacks, op_prefix="B:")

    rows = res.rows.to_dict("records")
    mode = res.summary.get("mode")
    paired: dict[int, int] = {}
    per_rec: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        d, b = _rid(row.get("device_record_id")), _rid(row.get("bench_record_id"))
        if d is not None and b is not None and row.get("match") != "unmatched":
            paired[d] = b
        if d is not None:
            per_rec.setdefault(d, []).append(row)
    bench_paired = set(paired.values())

    # verdicts of device records
    for rid, rrows in per_rec.items():
        nid = dnode.get(rid)
        if nid is None:
            continue
        n = nodes[nid]
        verdict, err, amp, reason = "none", None, None, None
        for r in rrows:
            v = str(r.get("verdict") or "none")
            if v not in ("pass", "warning", "error", "skip"):
                v = "none"
            if v == "error" and verdict != "error":
                reason = r.get("reason")
            verdict = worse(verdict, v)
            e, a = _num(r.get("error")), _num(r.get("amplification"))
            if e is not None and (err is None or e > err):
                err = e
            if a is not None and (amp is None or a > amp):
                amp = a
        if n.kind == "module":  # module records: the node's own verdict is its worst call
            n.verdict = worse(n.verdict, verdict)
            n.error = err if n.error is None or (err is not None and err > n.error) else n.error
            n.amplification = amp if n.amplification is None or (amp is not None and amp > n.amplification) else n.amplification
            for call in n.calls:
                if call["record_id"] == rid:
                    call["metrics"] = [_metric(r) for r in rrows]
                    call["verdict"] = verdict
                    idx = precision_index(call["metrics"], mode)
                    if idx is not None:
                        call["precision_index"] = idx
                        n.precision_index = idx if n.precision_index is None else max(n.precision_index, idx)
                    call["bench_name"] = bnodes_name(bframe, paired.get(rid))
        else:
            n.verdict, n.error, n.amplification = verdict, err, amp
            n.reason = reason or n.reason
            n.metrics = [_metric(r) for r in rrows]
            n.precision_index = precision_index(n.metrics, mode)
            b = paired.get(rid)
            if b is not None and bnode.get(b) in bnodes:
                bn = bnodes[bnode[b]]
                n.bench_name, n.bench_tensors = bn.name, bn.tensors

    # device records with no partner: unmatched
    for rid, nid in dnode.items():
        n = nodes[nid]
        if n.kind == "op" and rid not in paired:
            n.side = "device"

    # module structure: modules on one side only
    bench_paths = {bn.module for bn in bnodes.values() if bn.kind == "module"}
    dev_map: dict[str, str] = {}  # bench-named (mapped) path -> device path
    for n in nodes.values():
        if n.kind == "module":
            mapped = map_module(n.module, mapping)
            dev_map[mapped] = n.module
            if mapped not in bench_paths:
                n.side = "device"
    for path in sorted(bench_paths, key=lambda p: bnodes[module_id(p)].order):
        if path not in dev_map:
            _bench_module(nodes, bnodes, path, dev_map)

    # bench records with no partner: added under their module (its device node when paired)
    for rid, bid in bnode.items():
        bn = bnodes[bid]
        if rid in bench_paired or bn.kind != "op":
            continue
        mid = _bench_module(nodes, bnodes, bn.module, dev_map)
        node = Node(**{**bn.to_dict(), "parent": mid, "side": "bench", "children": []})
        nodes[bid] = node
        nodes[mid].children.append(bid)

    warnings: list[str] = []
    n_manual = _apply_record_matches(nodes, manual, warnings, step, rank)

    root_cause = None
    rc = res.root_cause
    if rc is not None:
        root_cause = dnode.get(int(rc.index))
        if root_cause is None or nodes[root_cause].name != rc.name and nodes[root_cause].kind == "op":
            root_cause = next((k for k, v in nodes.items() if v.name == rc.name), root_cause)
        if root_cause is not None:
            nodes[root_cause].reason = rc.reason
    g = Graph(nodes=nodes, root=module_id(""), mode="compare", step=step, rank=rank, device_dump=str(device_dump),
              bench_dump=str(bench_dump), root_cause=root_cause,
              warnings=list(dict.fromkeys(list(res.summary.get("warnings", [])) + dwarn + bwarn + warnings)),
              bands=bands, matches=manual.to_dict(step, rank))
    g.aggregate()
    s = res.summary
    g.summary = jsonable({
        "diverged": bool(res.diverged), "mode": s.get("mode"), "n_compared": s.get("n_compared"),
        "n_pass": s.get("n_pass"), "n_warning": s.get("n_warning"), "n_error": s.get("n_error"),
        "nodes": len(nodes), "unmatched_nodes": sum(1 for n in nodes.values() if n.side != "both"),
        "error_nodes": sum(1 for n in nodes.values() if n.verdict == "error"),
        "overflow_nodes": sum(1 for n in nodes.values() if n.overflow in ("critical", "high")),
        "manual_matches": n_manual + len(manual.modules),
        "worst_index": g.nodes[g.root].worst_index,
        "root_cause": rc.to_dict() if rc is not None else None,
        "suspects": [{"name": x.name, "module": x.module, "phase": x.phase, "score": x.score} for x in res.suspects[:10]],
    })
    return g


def bnodes_name(bframe: Any, rid: int | None) -> str | None:
    """The bench record name of a bench record id."""
    if rid is None:
        return None
    hit = bframe.loc[bframe["record_id"] == rid, "name"]
    return str(hit.iloc[0]) if len(hit) else None


def _bench_module(nodes: dict[str, Node], bnodes: dict[str, Node], path: str, dev_map: dict[str, str]) -> str:
    """The node id standing for bench module ``path``: its device twin when the (mapped) module
    exists on both sides, else a bench-only module node (created with its bench-only ancestors).
    A bench-only module whose name a different device module already uses gets the id
    ``BM:<path>``, so that it never overwrites that device module."""
    if path in dev_map:
        return module_id(dev_map[path])
    nid = module_id(path)
    if nid in nodes and nodes[nid].side == "bench":
        return nid
    if nid in nodes:
        nid = f"BM:{path}"
        if nid in nodes:
            return nid
    if not path:
        return module_id("")
    parent = _bench_module(nodes, bnodes, path.rsplit(".", 1)[0] if "." in path else "", dev_map)
    bn = bnodes.get(module_id(path))
    nodes[nid] = Node(id=nid, name=path, kind="module", parent=parent, module=path,
                      module_class=bn.module_class if bn else None, side="bench",
                      order=bn.order if bn else 1 << 60, calls=bn.calls if bn else [])
    nodes[parent].children.append(nid)
    return nid


def _apply_record_matches(nodes: dict[str, Node], manual: Matches, warnings: list[str], step: int, rank: int) -> int:
    """Join manually matched unmatched records: the device node takes the bench side's tensors
    and statistic differences (no verdict), the bench-only node is removed. Returns the count."""
    done = 0
    by_name: dict[tuple[str, str], str] = {}
    for nid, n in nodes.items():
        if n.kind == "op" and n.side in ("device", "bench"):
            by_name.setdefault((n.side, n.name), nid)
    for dname, bname in manual.records.items():
        did, bid = by_name.get(("device", dname)), by_name.get(("bench", bname))
        if did is None or bid is None or bid not in nodes:
            which = f"device record {dname!r}" if did is None else f"bench record {bname!r}"
            warnings.append(f"{manual.source}: {which} is not an unmatched record of step {step} rank {rank}; "
                            "match ignored")
            continue
        d, b = nodes[did], nodes.pop(bid)
        if b.parent in nodes and bid in nodes[b.parent].children:
            nodes[b.parent].children.remove(bid)
        d.side, d.manual, d.bench_name, d.bench_tensors = "both", True, b.name, b.tensors
        d.metrics = manual_metrics(d.tensors, b.tensors)
        d.precision_index = precision_index(d.metrics, "statistics")
        d.reason = "matched by hand: statistics compared, not judged"
        done += 1
    return done
