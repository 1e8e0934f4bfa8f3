"""Pair a compiled graph's records (``torchparity.compile_backend``) with an eager dump's ops.

A compiled dump (its step header has a ``compile`` object) records one record per eager aten op
that the graph computes: Inductor's decompositions of one op are captured once, as that op
(docs/compile.md). Its sequence is still not the eager one: views, ``t``, ``detach``, ops the
partitioner or Inductor removed, and the ops outside the compiled region (the loss, the
optimizer) have no compiled record. So the records are aligned per (phase, module, source op),
in order, on the shape of output 0 (the only tensor a compiled record has): an order-preserving
alignment that skips the eager calls without a compiled counterpart. What does not align stays
unmatched on its side - never an error. The general matcher's cross-op stages (a different op of
the same shapes, renamed modules) are not used: a compiled record names its source op and module,
so pairing it with another op would compare different values.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import matching

#: copies that only change a value's memory layout. Eager and compiled runs make different layout
#: choices (a compiled ``matmul`` clones an expanded operand that eager reshapes as a view), so the
#: k-th ``clone`` of a module on one side is not the k-th on the other; their values are copies of
#: values captured anyway, so they are left unmatched rather than paired by order
LAYOUT_COPIES = frozenset({"aten.clone.default", "aten._unsafe_view.default", "aten.contiguous.default",
                           "aten.copy.default", "aten.alias.default", "aten.lift_fresh_copy.default",
                           "aten.view_copy.default", "aten.expand_copy.default", "aten._reshape_copy.default"})


def is_compiled(header: Mapping[str, Any] | None) -> bool:
    """Whether a step header is a compiled capture's (it carries a ``compile`` object)."""
    return isinstance(header, Mapping) and isinstance(header.get("compile"), Mapping)


def _output_shapes(rows: Any) -> dict[int, str]:
    """record id -> the text of its output 0 shape ("" when it has none)."""
    sub = rows[(matching.text_column(rows["io"]) == "output") & (matching.text_column(rows["arg"]) == "0")]
    if not len(sub):
        return {}
    shp = matching.text_column(sub["shape"], missing="-")
    return dict(zip(sub["record_id"].tolist(), shp.tolist()))


def match_compiled(dev_rows: Any, bench_rows: Any, mapping: Mapping[str, str] | None = None) -> Any:
    """Pair records of one (step, rank) where one side (or both) is a compiled capture. Returns
    the frame of :func:`matching.match_records`: ``dev_rid, bench_rid, match`` (``compiled`` for
    pairs made here, ``unmatched`` with -1 on the other side)."""
    import pandas as pd

    d = matching.record_table(dev_rows, mapping)
    b = matching.record_table(bench_rows, None)
    sd, sb = _output_shapes(dev_rows), _output_shapes(bench_rows)
    gb: dict[tuple[Any, ...], list[int]] = {}
    for rid, *key in zip(b["record_id"].tolist(), b["phase"].tolist(), b["mkey"].tolist(), b["op"].tolist()):
        gb.setdefault(tuple(key), []).append(rid)
    gd: dict[tuple[Any, ...], list[int]] = {}
    for rid, *key in zip(d["record_id"].tolist(), d["phase"].tolist(), d["mkey"].tolist(), d["op"].tolist()):
        gd.setdefault(tuple(key), []).append(rid)
    got: list[tuple[int, int]] = []
    for key, ids_d in gd.items():
        ids_b = gb.get(key)
        if not ids_b or key[2] in LAYOUT_COPIES:
            continue
        a = [sd.get(i, "") for i in ids_d]
        bb = [sb.get(i, "") for i in ids_b]
        got += [(ids_d[x], ids_b[y]) for x, y in matching._align(a, bb)]
    md = {x for x, _ in got}
    mb = {y for _, y in got}
    ud = np.array([r for r in d["record_id"].tolist() if r not in md], dtype=np.int64)
    ub = np.array([r for r in b["record_id"].tolist() if r not in mb], dtype=np.int64)
    parts = [pd.DataFrame(got, columns=["dev_rid", "bench_rid"]).assign(match="compiled"),
             pd.DataFrame({"dev_rid": ud, "bench_rid": -1, "match": "unmatched"}),
             pd.DataFrame({"dev_rid": -1, "bench_rid": ub, "match": "unmatched"})]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    out["dev_rid"] = out["dev_rid"].astype("int64")
    out["bench_rid"] = out["bench_rid"].astype("int64")
    out["match"] = out["match"].astype(object)
    return out

