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

#: factory ops: constants, not computations. A decomposition brings its own (``masked_fill`` becomes
#: ``where(mask, scalar_tensor(v), x)``), so the k-th constant of a module on one side need not be
#: the k-th on the other (BERT: a compiled 0.0 against the eager mask's -inf): they pair only with a
#: constant of the same shape and value
CONSTANTS = frozenset(f"aten.{op}.{ov}" for op in ("scalar_tensor", "full", "zeros", "ones", "empty", "arange",
                                                    "iota", "full_like", "zeros_like", "ones_like", "empty_like",
                                                    "new_full", "new_zeros", "new_ones", "new_empty", "empty_strided")
                      for ov in ("default", "start", "start_step", "names", "memory_format", "out"))


#: ops a compiled graph records under another name than eager runs them (AOTAutograd's functional
#: batch norm: the running statistics are outputs, not written in place); output 0 is the same value
OP_ALIASES = {f"aten.{op}.default": "aten.native_batch_norm.default"
              for op in ("_native_batch_norm_legit_functional", "_native_batch_norm_legit",
                         "_native_batch_norm_legit_no_training")}


#: in-place adds of the backward outside a compiled graph: autograd accumulating a parameter's
#: gradient (a second micro-batch's ``grad += g``). A compiled run accumulates in its graph's input
#: order, eager in backward order, so a module's two same-shaped ones (a LayerNorm's weight and
#: bias) come in either order: they pair only by a signature that occurs once
ACCUMULATIONS = frozenset({"aten.add_.Tensor"})


def is_compiled(header: Mapping[str, Any] | None) -> bool:
    """Whether a step header is a compiled capture's (it carries a ``compile`` object)."""
    return isinstance(header, Mapping) and isinstance(header.get("compile"), Mapping)


def eager_outputs(rows: Any) -> Any:
    """An eager dump's rows without the input tensors of records that have outputs.

    A compiled record has its output only; an eager op's inputs are its producers' outputs,
    compared there. Left in, they would be tensors on the eager side only, where a one-sided check
    reads an eager softmax's masked ``-inf`` input as "NaN/Inf the other side does not have"."""
    io = matching.text_column(rows["io"])
    has_out = set(rows.loc[(io == "output").to_numpy(), "record_id"].tolist())
    drop = (io == "input").to_numpy() & rows["record_id"].isin(has_out).to_numpy()
    return rows[~drop] if drop.any() else rows


def _output_shapes(rows: Any) -> dict[int, str]:
    """record id -> the text of its output 0 shape ("" when it has none)."""
    sub = rows[(matching.text_column(rows["io"]) == "output") & (matching.text_column(rows["arg"]) == "0")]
    if not len(sub):
        return {}
    shp = matching.text_column(sub["shape"], missing="-")
    return dict(zip(sub["record_id"].tolist(), shp.tolist()))


def _output_values(rows: Any) -> dict[int, str]:
    """record id -> the text of its output 0's max and min (a constant's value)."""
    sub = rows[(matching.text_column(rows["io"]) == "output") & (matching.text_column(rows["arg"]) == "0")]
    if not len(sub) or "max" not in sub or "min" not in sub:
        return {}
    return {rid: f"|{hi!r}|{lo!r}" for rid, hi, lo in zip(sub["record_id"].tolist(), sub["max"].tolist(),
                                                           sub["min"].tolist())}


def occurrences(full_rows: Any) -> dict[int, Any]:
    """record id -> ``flags.occurrence`` of a compiled capture's records (the op's index among its
    module's ops of that kind in the graph, the values not captured included), from a full frame;
    ``(occurrence, occurrences)`` where the record also says how many there are in its graph."""
    if full_rows is None or "flags" not in full_rows or not len(full_rows):
        return {}
    rec = full_rows.drop_duplicates("record_id")
    out: dict[int, Any] = {}
    for rid, f in zip(rec["record_id"].tolist(), rec["flags"].tolist()):
        if isinstance(f, str):
            import json

            try:
                f = json.loads(f)
            except ValueError:
                continue
        if isinstance(f, dict) and type(f.get("occurrence")) is int and f["occurrence"] >= 0:
            n = f.get("occurrences")
            out[int(rid)] = (f["occurrence"], n) if type(n) is int and n > f["occurrence"] else f["occurrence"]
    return out


def _with_gaps(ids: list[int], sigs: list[str], occ: Mapping[int, Any]) -> tuple[list[str], list[int | None], list[int]]:
    """The signatures of one (phase, module, op) group with a never-matching token for each value
    the compiled graph did not capture (from the records' occurrences), so that the k-th captured
    record lines up with the eager op at the same position, and where each graph run starts.
    Occurrences restart with each graph run; a run whose records say how many occurrences their
    graph has is closed with gaps for the ones after its last captured value (two runs a step,
    gradient accumulation: run 1's last ``mul`` is not captured, so run 2's first is not eager's
    second)."""
    tokens: list[str] = []
    where: list[int | None] = []
    nxt, total = 0, None
    starts: list[int] = []

    def gaps(k: int) -> None:
        for _ in range(k):
            tokens.append(f"\x00gap{len(tokens)}")
            where.append(None)

    for rid, sig in zip(ids, sigs):
        o = occ.get(rid)
        if isinstance(o, tuple):
            o, n = o
        else:
            n = None
        if o is not None:
            if not starts or o < nxt or (total is not None and nxt >= total):  # the next run of the graph
                if starts and total is not None:
                    gaps(total - nxt)
                nxt = 0
                starts.append(len(tokens))
            gaps(o - nxt)
            nxt, total = o + 1, n
        tokens.append(sig)
        where.append(rid)
    if starts and total is not None:
        gaps(total - nxt)
    return tokens, where, starts


def align_group(ids_d: list[int], sig_d: list[str], occ_d: Mapping[int, Any],
                ids_b: list[int], sig_b: list[str], occ_b: Mapping[int, Any],
                unordered: bool = False) -> list[tuple[int, int]]:
    """Pairs (device id, bench id) of one (phase, module, op) group. A compiled side's records sit at
    their occurrence (the values not captured are gaps); when both sequences are then equally long
    the graph ran this module's ops as eager did and position k pairs with position k (an order
    alignment would pair a captured k-th ``add`` with the first eager ``add`` of the same shape);
    otherwise an order-preserving alignment on the signatures (around values not captured, only of
    signatures that occur once on each side). When the graph ran several times in the step
    (gradient accumulation), each run is aligned with its share of the other side. ``unordered``:
    the two sides ran these ops in different orders (gradient accumulations): only signatures
    that occur once on each side pair."""
    a, wa, ra = _with_gaps(ids_d, sig_d, occ_d)
    bb, wb, rb = _with_gaps(ids_b, sig_b, occ_b)
    runs = max(len(ra), len(rb))
    if runs > 1:  # graph runs (gradient accumulation): run k against the k-th equal share of the other side
        ra, rb = ra or _shares(len(a), runs), rb or _shares(len(bb), runs)
        if len(ra) == len(rb) == runs:
            out: list[tuple[int, int]] = []
            for k in range(runs):
                ea, eb = (ra + [len(a)])[k + 1], (rb + [len(bb)])[k + 1]
                out += _align_run(a[ra[k]:ea], wa[ra[k]:ea], bb[rb[k]:eb], wb[rb[k]:eb])
            return out
    return _align_run(a, wa, bb, wb, several=runs > 1 or unordered)


def _shares(n: int, runs: int) -> list[int]:
    """The starts of ``runs`` equal shares of a side without graph runs (an eager group), or none
    when ``n`` does not divide: then no run is told from the next."""
    return list(range(0, n, n // runs)) if n % runs == 0 and n else []


def _align_run(a: list[str], wa: list[int | None], bb: list[str], wb: list[int | None],
               several: bool = False) -> list[tuple[int, int]]:
    """:func:`align_group` of one graph run (``several``: runs that could not be told apart)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(bb)
    if len(a) == len(bb) and (None in wa or None in wb):
        idx = [(x, x) for x in range(len(a)) if a[x] == bb[x]]
    elif all(n == 1 for n in ca.values()) and all(n == 1 for n in cb.values()):
        # every signature once on each side: the same op whatever the order (a compiled run's
        # gradient accumulations run in the graph's input order, eager's in backward order)
        at = {sig: y for y, sig in enumerate(bb)}
        idx = [(x, at[sig]) for x, sig in enumerate(a) if sig in at]
    else:
        idx = matching._align(a, bb)
        if None in wa or None in wb or several:
            # sequences of different lengths (CSE, an op only eager has) around values not captured,
            # or graph runs that could not be told apart: a signature that repeats cannot say which
            # eager op a captured value is; an unpaired value is "not compared", a wrongly paired
            # one a false alarm (HF Llama's adds; gradient accumulation's micro-batches)
            idx = [(x, y) for x, y in idx if ca[a[x]] == 1 and cb[bb[y]] == 1]
    return [(wa[x], wb[y]) for x, y in idx if wa[x] is not None and wb[y] is not None]


def match_compiled(dev_rows: Any, bench_rows: Any, mapping: Mapping[str, str] | None = None,
                   occ_d: Mapping[int, Any] | None = None, occ_b: Mapping[int, Any] | None = None) -> Any:
    """Pair records of one (step, rank) where one side (or both) is a compiled capture. Returns
    the frame of :func:`matching.match_records`: ``dev_rid, bench_rid, match`` (``compiled`` for
    pairs made here, ``unmatched`` with -1 on the other side)."""
    import pandas as pd

    d = matching.record_table(dev_rows, mapping)
    b = matching.record_table(bench_rows, None)
    sd, sb = _output_shapes(dev_rows), _output_shapes(bench_rows)
    vd, vb = _output_values(dev_rows), _output_values(bench_rows)
    gb: dict[tuple[Any, ...], list[int]] = {}
    for rid, ph, mk, op in zip(b["record_id"].tolist(), b["phase"].tolist(), b["mkey"].tolist(), b["op"].tolist()):
        gb.setdefault((ph, mk, OP_ALIASES.get(op, op)), []).append(rid)
    gd: dict[tuple[Any, ...], list[int]] = {}
    for rid, ph, mk, op in zip(d["record_id"].tolist(), d["phase"].tolist(), d["mkey"].tolist(), d["op"].tolist()):
        gd.setdefault((ph, mk, OP_ALIASES.get(op, op)), []).append(rid)
    got: list[tuple[int, int]] = []
    for key, ids_d in gd.items():
        ids_b = gb.get(key)
        if not ids_b or key[2] in LAYOUT_COPIES:
            continue
        const = key[2] in CONSTANTS
        got += align_group(ids_d, [sd.get(i, "") + (vd.get(i, "?d") if const else "") for i in ids_d], occ_d or {},
                           ids_b, [sb.get(i, "") + (vb.get(i, "?b") if const else "") for i in ids_b], occ_b or {},
                           unordered=key[0] == "backward" and key[2] in ACCUMULATIONS)
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



#: the columns of a tensor row that describe the tensor itself (taken from the producer's output)
_TENSOR_COLS = ("kind", "dtype", "shape", "requires_grad", "max", "min", "mean", "norm", "nan", "inf", "md5",
                "value", "tensor", "compute_dtype")


def _dev_is_compiled(dev_rows: Any, bench_rows: Any, dev_compiled: bool | None) -> bool:
    """Which side is the compiled capture: told by the step headers (``dev_compiled``); when both
    or neither are, the side without input rows (a compiled graph's records have outputs only)."""
    if dev_compiled is not None:
        return dev_compiled
    return not (dev_rows["io"] == "input").any() and (bench_rows["io"] == "input").any()


def add_inputs(dev_rows: Any, bench_rows: Any, pairs: Any, dev_compiled: bool | None = None) -> tuple[Any, Any]:
    """Give the compiled side's paired records the input rows of their eager counterparts.

    A compiled record has its output only. An eager op's input that is its producer's output 0,
    unchanged (same shape: no view in between), is on the compiled side the output of the compiled
    record paired with that producer: that row is added as the compiled record's input (same
    ``arg``, ``producer`` = that compiled record), so the input is compared like an eager pair's
    and the root cause gets its input error. Inputs that cannot be traced this way stay on the
    eager side only (unmatched rows)."""
    import pandas as pd

    dev_is_compiled = _dev_is_compiled(dev_rows, bench_rows, dev_compiled)
    eager, comp = (bench_rows, dev_rows) if dev_is_compiled else (dev_rows, bench_rows)
    p = pairs[(pairs["dev_rid"] >= 0) & (pairs["bench_rid"] >= 0)]
    e2c = dict(zip(p["bench_rid"].tolist(), p["dev_rid"].tolist())) if dev_is_compiled else \
        dict(zip(p["dev_rid"].tolist(), p["bench_rid"].tolist()))
    if not e2c or "producer" not in eager.columns:
        return dev_rows, bench_rows
    c_out = comp[(comp["io"] == "output") & (comp["arg"].astype(str) == "0")].drop_duplicates("record_id").set_index("record_id")
    e_out = eager[(eager["io"] == "output") & (eager["arg"].astype(str) == "0")].drop_duplicates("record_id").set_index("record_id")
    e_shape = e_out["shape"].to_dict()
    reshapes = _reshape_sources(eager)
    new = []
    cand = eager[(eager["io"] == "input") & eager["producer"].notna() & eager["record_id"].isin(list(e2c))]
    for rid, arg, prod, shape in zip(cand["record_id"].tolist(), cand["arg"].tolist(), cand["producer"].tolist(),
                                     cand["shape"].tolist()):
        if not isinstance(prod, tuple) or len(prod) != 2 or prod[1] != 0:
            continue
        at, reshaped = prod[0], False
        for _ in range(_MAX_RESHAPES):  # through reshapes the graph does not record (view, _unsafe_view)
            if at in e2c or at not in reshapes:
                break
            at, reshaped = reshapes[at], True
        src = e2c.get(at)
        if src is None or src not in c_out.index or e2c[rid] not in c_out.index:
            continue
        if _shape_key(e_shape.get(at)) != _shape_key(shape) and not (reshaped and _numel(e_shape.get(at)) == _numel(shape)):
            continue  # a view between producer and consumer: not the same value
        row = c_out.loc[e2c[rid]].copy()
        srow = c_out.loc[src]
        if reshaped and srow.get("tensor") is not None and _shape_key(srow.get("shape")) != _shape_key(shape):
            continue  # tensor mode: the saved tensor has the producer's shape
        for c in _TENSOR_COLS:
            if c in row.index:
                row[c] = srow[c]
        if reshaped:  # the same elements in the same order: the same statistics, the consumer's shape
            row["shape"] = shape
        row["io"], row["arg"], row["producer"] = "input", arg, (src, 0)
        row["record_id"] = e2c[rid]
        new.append(row)
    if not new:
        return dev_rows, bench_rows
    add = pd.DataFrame(new).reset_index(drop=True)[comp.columns]
    comp = pd.concat([comp, add], ignore_index=True)
    return (comp, bench_rows) if dev_is_compiled else (dev_rows, comp)


#: ops that give the same elements in the same order another shape: an eager consumer reading a
#: compiled value through them reads the value's statistics
RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "alias",
                      "contiguous", "clone", "view_copy", "_reshape_copy", "_reshape_alias"})
_MAX_RESHAPES = 4


def _reshape_sources(eager: Any) -> dict[int, int]:
    """Eager reshape records (:data:`RESHAPES`): record id -> the record whose output 0 it reshapes."""
    from .error_model import op_stem

    ins = eager[(eager["io"] == "input") & (eager["arg"].astype(str) == "0") & eager["producer"].notna()]
    out: dict[int, int] = {}
    for rid, op, prod in zip(ins["record_id"].tolist(), ins["op"].tolist(), ins["producer"].tolist()):
        if isinstance(prod, tuple) and len(prod) == 2 and prod[1] == 0 and op_stem(op) in RESHAPES:
            out[int(rid)] = int(prod[0])
    return out


def _numel(s: Any) -> int | None:
    k = _shape_key(s)
    if not isinstance(k, tuple):
        return None
    n = 1
    for d in k:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            return None
        n *= int(d)
    return n


def _shape_key(s: Any) -> Any:
    if s is None or (isinstance(s, float) and s != s):
        return None
    return tuple(s) if isinstance(s, (list, tuple, np.ndarray)) else s


#: why a one-sided row of a compiled-vs-eager compare is not judged
ONE_SIDED = ("in one run only: the compiled graph does not hold this value separately (fused, decomposed or "
             "deduplicated), so there is nothing to compare it with")


def skip_one_sided(rows: Any, keys: set[tuple[int, int]]) -> int:
    """In the (step, rank) units of ``keys`` (compiled captures), rows with a value on one side only
    become ``skip`` (:data:`ONE_SIDED`) whatever a checker said: the other run compiled that value
    away, which says nothing about its numerics (an eager attention mask's ``-inf`` the compiled
    graph folded into another op is no overflow). Returns how many rows changed."""
    import pandas as pd

    if not keys or not len(rows) or "device_dtype" not in rows or "bench_dtype" not in rows:
        return 0
    unit = pd.Series(list(zip(rows["step"].tolist(), rows["rank"].tolist())), index=rows.index).isin(keys)
    one = rows["device_dtype"].isna() ^ rows["bench_dtype"].isna()
    mask = (unit & one & (rows["verdict"] != "skip")).to_numpy()
    if not mask.any():
        return 0
    for col, val in (("verdict", "skip"), ("reason", ONE_SIDED), ("checker", "")):
        v = rows[col].to_numpy(dtype=object).copy()
        v[mask] = val
        rows[col] = pd.Series(v, index=rows.index, dtype=object)
    return int(mask.sum())


def random_mismatch(headers: list[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]) -> str | None:
    """Why a compiled-vs-eager compare cannot judge values (``None`` when it can): one side is an
    Inductor capture whose graphs draw random numbers (dropout ...) from Inductor's own generator
    (``torch._inductor.config.fallback_random`` off), the other side is not, so every value after
    the first random op differs for a reason that is not numerics. ``headers``: (device, bench) step
    headers of the units compared."""
    for hd, hb in headers:
        cd = hd.get("compile") if is_compiled(hd) else None
        cb = hb.get("compile") if is_compiled(hb) else None
        if (cd is None) == (cb is None):
            continue  # both eager, or both compiled (Inductor draws the same numbers from the same seed)
        c = cd if cd is not None else cb
        if c.get("random_ops") and c.get("inner") == "inductor" and c.get("fallback_random") is False:
            return (f"the compiled run's graphs draw random numbers ({c['random_ops']} random op(s), e.g. dropout) "
                    f"from Inductor's own generator, so its values differ from the eager run's after the first of "
                    f"them whatever the numerics: re-run the compiled side with "
                    f"torch._inductor.config.fallback_random = True (or without dropout, model.eval()) and compare again")
    return None


def reads_graph_inputs(dev_rows: Any, bench_rows: Any, pairs: Any, dev_compiled: bool | None = None) -> set[int]:
    """Device record ids of paired records whose eager counterpart reads a tensor made outside
    the captured ops (no producer: a parameter, a buffer, optimizer state, the batch). On the
    compiled side such a tensor is a graph input and is not captured, so the pair's input error
    is not known in full: after a trained step (parameters drifted apart by Adam's +-lr on
    gradients ~0 on both sides) the op reading it must not be blamed for that difference."""
    dev_is_compiled = _dev_is_compiled(dev_rows, bench_rows, dev_compiled)
    eager = bench_rows if dev_is_compiled else dev_rows
    if "producer" not in eager.columns:
        return set()
    leaf = eager[(eager["io"].isin(["input", "param"])) & (eager["kind"] == "tensor") & eager["producer"].isna()]
    ids = set(leaf["record_id"].tolist())
    p = pairs[(pairs["dev_rid"] >= 0) & (pairs["bench_rid"] >= 0)]
    col = "bench_rid" if dev_is_compiled else "dev_rid"
    return {int(d) for d, e in zip(p["dev_rid"].tolist(), p[col].tolist()) if e in ids}


def unpaired_accumulations(dev_rows: Any, pairs: Any) -> set[int]:
    """Device record ids of gradient accumulations (:data:`ACCUMULATIONS` in the backward) left
    unpaired: one of their inputs is the ``.grad`` an earlier micro-batch wrote, whose error the
    dump cannot trace (it was stolen from that backward's output or copied into place), so what
    their consumers see is not theirs to answer for; the backward ops that made both gradients
    are judged themselves."""
    acc = dev_rows[(dev_rows["phase"] == "backward") & dev_rows["op"].isin(ACCUMULATIONS)]
    if not len(acc):
        return set()
    paired = set(pairs.loc[(pairs["dev_rid"] >= 0) & (pairs["bench_rid"] >= 0), "dev_rid"].tolist())
    return {int(r) for r in acc["record_id"].unique().tolist() if r not in paired}
