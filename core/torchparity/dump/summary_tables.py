"""The three summary tables (ops, tensors, modules) of one (step, rank), from its record columns.

One builder for both ways a summary is made, so that they cannot disagree: ``torchparity compact``
fills a :class:`~.columns.RecordColumns` by reading ``records.jsonl`` back (:func:`.columnar.unit_tables`),
the dump writer fills one from the record objects it has just written (:mod:`.summary_live`).
:func:`build_tables` validates the columns with the reader's own checks (records the reader would
drop are left out and named in the metadata's warnings) and turns them into Arrow tables: whole
columns at a time, no pandas, no per-row Python work beyond a few list passes.
"""

from __future__ import annotations

import json
import operator
from itertools import repeat
from typing import Any

from .columns import STAT_COLUMNS, RecordColumns, _ints, _NO_STATS, _stat_arrays
from .damage import Damage

SUMMARY_VERSION = 1
_I64 = 2 ** 63
_NONE = type(None)
_FLAT = frozenset({str, int, bool, float, _NONE})  # values whose JSON the cache key tells apart


class NotSummarizable(Exception):
    """The unit's values do not fit the Parquet schema losslessly (the JSONL then serves alone)."""


def _check_ints(values: Any, what: str) -> None:
    for v in values:
        if v is not None and not (type(v) is int and -_I64 <= v < _I64):
            raise NotSummarizable(f"{what} {v!r:.40} is not a 64-bit integer")


try:  # a cache key that tells apart what json.dumps tells apart (-0.0 and 0.0; not NaN and Infinity)
    from orjson import dumps as _key_bytes
except ImportError:  # pragma: no cover - orjson is a dependency
    _key_bytes = None


#: texts of the flat values seen so far, kept across steps (a compiled graph's records carry the
#: same flags every step); cleared when it holds _TEXTS_MAX of them
_TEXTS: dict[Any, str] = {}
_TEXTS_MAX = 1 << 16


def _json_texts(values: list[Any], skip_empty: bool = False) -> list[str | None]:
    """``json.dumps`` of each value (None stays None; ``skip_empty``: falsy values are None too).
    Equal scalars and equal flat dicts (scalar arguments and flags repeat a lot, within a step and
    from step to step) are encoded once; texts holding a non-finite number are never cached (NaN is
    not equal to itself)."""
    cache = _TEXTS
    if len(cache) > _TEXTS_MAX:
        cache.clear()
    out: list[str | None] = []
    add = out.append
    dumps = json.dumps
    for v in values:
        if v is None or (skip_empty and not v):
            add(None)
            continue
        t = type(v)
        key: Any = None
        if t is str or t is int or t is bool:
            key = (t, v)
        elif t is float:
            key = (t, v) if v != 0 else None  # -0.0 == 0.0, json.dumps writes them apart
        elif t is dict and _key_bytes is not None:
            types = tuple(map(type, v.values()))
            if _FLAT.issuperset(types):  # flags: a few flat dicts of scalars, repeated
                try:
                    key = (types, _key_bytes(v))
                except Exception:  # a key orjson does not take: no caching
                    key = None
        text = cache.get(key) if key is not None else None
        if text is None:
            text = dumps(v)
            if key is not None and "NaN" not in text and "Infinity" not in text:
                cache[key] = text
        add(text)
    return out


def build_tables(cols: RecordColumns, n_scanned: int, scan_w: list[str], fp: dict[str, Any], step: int, rank: int,
                 tree: dict[Any, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three Arrow tables of one (step, rank) and the metadata that goes with them.

    :param cols: the records' columns (``full=True``), as the reader collects them.
    :param n_scanned: records read from ``records.jsonl``; ``scan_w``: the reader's warnings.
    :param fp: the fingerprint of that ``records.jsonl`` (:func:`.columnar.fingerprint`).
    :param tree: ``modules.jsonl`` by module path (a module's class and parent).
    """
    import numpy as np
    import pyarrow as pa

    rel = f"step{step}/rank{rank}"
    bad_full = cols.problems()
    bad_compare: dict[int, str] = {}
    if bad_full:  # the compare validates fewer columns: it must drop the same records
        cols.full = False
        bad_compare = cols.problems()
        cols.full = True
    frame_w: list[str] = []
    if bad_full:
        frame_w.append(Damage(cols.damage_message(bad_full, f"{rel}/records.jsonl")))
    ids, names, ops, levels, phases, modules, cis, fwds, stacks, cdt = cols.heads
    mcls, _steps, _ranks, flags = cols.xheads
    rec, io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys = cols.cols
    device = cols.device
    n_rec = cols.n_records
    if bad_full:
        keep_rec = [i for i in range(n_rec) if i not in bad_full]
        rows = [j for j, i in enumerate(rec) if i not in bad_full]
        seq_of = np.full(n_rec, -1, dtype="int64")
        seq_of[keep_rec] = np.arange(len(keep_rec))

        def pick(col: list[Any], at: list[int]) -> list[Any]:
            return [col[i] for i in at]

        ids, names, ops, levels, phases, modules, cis, fwds, stacks, cdt, mcls, flags = (
            pick(c, keep_rec) for c in (ids, names, ops, levels, phases, modules, cis, fwds, stacks, cdt, mcls, flags))
        rec_kept = np.asarray(pick(rec, rows), dtype="int64")
        seqs = seq_of[rec_kept]
        io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys, device = (
            pick(c, rows) for c in (io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys,
                                    device))
    else:  # a clean dump (the usual case): every record and row, a record's seq is its index
        seqs = np.asarray(rec, dtype="int64")
    n_keep, n_rows = len(ids), len(seqs)
    _check_ints(fwds, "fwd")
    _check_ints(stacks, "stack")
    ids_a = _ints(ids) if n_keep else np.zeros(0, "int64")
    flag_dicts = [f if type(f) is dict else None for f in flags]
    heads_a = {k: pa.array(v, pa.string()) for k, v in
               (("name", names), ("op", ops), ("level", levels), ("phase", phases), ("module", modules))}
    ops_t = pa.table({
        "seq": pa.array(np.arange(n_keep, dtype="int64")),
        "record_id": pa.array(ids_a),
        **heads_a,
        "module_class": pa.array(mcls, pa.string()),
        "call_index": pa.array(_ints(cis) if n_keep else np.zeros(0, "int64")),
        "fwd": pa.array(fwds, pa.int64()), "stack": pa.array(stacks, pa.int64()),
        "compute_dtype": pa.array(cdt, pa.string()),
        "collective": pa.array([f is not None and bool(f.get("collective")) for f in flag_dicts], pa.bool_()),
        "tensors": pa.array(np.bincount(seqs, minlength=n_keep).astype("int64")),
        "flags": pa.array(_json_texts(flags, skip_empty=True), pa.string()),
    })
    sa = _stat_arrays(stats) if n_rows else {c: np.zeros(0) for c in STAT_COLUMNS}
    no_stats = np.fromiter(map(operator.is_, stats, repeat(_NO_STATS)), dtype=bool, count=n_rows)
    stat_cols: dict[str, Any] = {}
    for c in STAT_COLUMNS:
        a = sa[c]
        if c in ("nan", "inf"):
            given = a[~no_stats]
            if len(given) and not (np.isfinite(given).all() and (given == np.round(given)).all()
                                   and np.abs(given).max() < 2 ** 53):
                raise NotSummarizable(f"a '{c}' count is not a whole number")
            stat_cols[c] = pa.array(np.where(no_stats, 0, np.nan_to_num(a)).astype("int64"), mask=no_stats)
        else:
            stat_cols[c] = pa.array(a, mask=no_stats)
    prods = [p if type(p) is list and p else None for p in prod]
    for what, vals in (("shape", shape), ("stride", stride), ("producer", prods)):
        distinct = set(map(tuple, filter(None, vals)))  # shapes are shared: few distinct ones
        for v in distinct:
            _check_ints(v, what)
    if set(map(type, arg)) - {str}:
        arg = [str(a) for a in arg]
    # one entry per record (a compiled graph's records: their output): the record columns as they are
    one_each = n_rows == n_keep and bool((seqs == np.arange(n_rows)).all())
    seqs_a = pa.array(seqs)
    tensors_t = pa.table({
        "seq": seqs_a,
        "record_id": pa.array(ids_a[seqs] if n_rows else np.zeros(0, "int64")),
        **(heads_a if one_each else {k: a.take(seqs_a) for k, a in heads_a.items()}),
        "io": pa.array(io, pa.string()),
        "arg": pa.array(arg, pa.string()),
        "kind": pa.array(kind, pa.string()),
        "dtype": pa.array(dtype, pa.string()),
        "shape": pa.array(shape, pa.list_(pa.int64())),
        "stride": pa.array(stride, pa.list_(pa.int64())),
        "device": pa.array(device, pa.string()),
        "requires_grad": pa.array(rg, pa.bool_()),
        **stat_cols,
        "md5": pa.array(md5, pa.string()),
        "value": pa.array(_json_texts(value), pa.string()),
        "producer": pa.array(prods, pa.list_(pa.int64())),
        "file": pa.array(files, pa.string()),
        "key": pa.array(keys, pa.string()),
    })
    modules_t = module_table(modules, phases, levels, mcls, seqs, kind, sa, stat_cols, tree)
    meta = {"version": SUMMARY_VERSION, "records_jsonl": fp, "scanned": n_scanned, "step": step, "rank": rank,
            "scan_warnings": [[str(w), isinstance(w, Damage)] for w in scan_w],
            "frame_warnings": [[str(w), True] for w in frame_w],
            # the compare's own checks drop exactly these records too: its frame can come from here
            "compare_ok": set(bad_full) == set(bad_compare),
            "requires_grad_all_bool": set(map(type, cols.cols[7])) <= {bool}}
    return {"ops": ops_t, "tensors": tensors_t, "modules": modules_t}, meta


def _group_reduce(ufunc: Any, values: Any, order: Any, starts: Any, n_groups: int, present: Any, fill: Any) -> Any:
    """``ufunc`` over each group's values (rows sorted by group: ``order``, groups begin at ``starts``);
    ``fill`` for the groups without rows."""
    import numpy as np

    out = np.full(n_groups, fill, dtype=values.dtype)
    if len(starts):
        out[present] = ufunc.reduceat(values[order], starts)
    return out


def module_table(modules: list[str], phases: list[str], levels: list[str], mcls: list[Any], seqs: Any,
                 kind: list[Any], sa: dict[str, Any], stat_cols: dict[str, Any], tree: dict[Any, Any]) -> Any:
    """One row per (module, phase) of this (step, rank), in order of first appearance: the records
    whose ``module`` is that path (directly, not its sub-modules) and the statistics of their tensor
    values (max of max, min of min, max of norm, ignoring NaN; sums of the NaN/Inf counts)."""
    import numpy as np
    import pyarrow as pa

    groups: dict[tuple[str, str], int] = {}
    gid = np.fromiter(map(groups.setdefault, zip(modules, phases), range(len(modules))), dtype="int64",
                      count=len(modules))
    # setdefault gave each record the index of its group's first record: number the groups 0..G-1
    firsts, gid = np.unique(gid, return_inverse=True)
    gid = gid.reshape(-1)
    n_groups = len(firsts)
    records = np.bincount(gid, minlength=n_groups).astype("int64")
    last = np.zeros(n_groups, dtype="int64")
    if len(gid):
        last[:] = len(gid) - 1 - np.unique(gid[::-1], return_index=True)[1]
    # a module record's class (the first given in its group), else the module tree's
    cls: dict[int, Any] = {}
    for i in [i for i, lv in enumerate(levels) if lv == "module"]:
        c = mcls[i]
        if c is not None:
            cls.setdefault(int(gid[i]), c)
    keys = list(groups)
    classes = []
    for g, (m, _p) in enumerate(keys):
        c = cls.get(g)
        if not isinstance(c, str):
            c = (tree.get(m) or {}).get("class")
        classes.append(c if isinstance(c, str) else None)
    parents = []
    for m, _p in keys:
        p = (tree.get(m) or {}).get("parent")
        parents.append(p if isinstance(p, str) else None)
    # tensor values: rows of kind "tensor", grouped by their record's group
    is_t = np.fromiter(map("tensor".__eq__, kind), dtype=bool, count=len(kind)) if len(kind) else np.zeros(0, bool)
    tg = gid[seqs[is_t]] if len(seqs) else np.zeros(0, "int64")
    order = np.argsort(tg, kind="stable")
    sg = tg[order]
    starts = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]]) if len(sg) else np.zeros(0, "int64")
    present = sg[starts]
    n_t = np.bincount(tg, minlength=n_groups).astype("int64")
    red = {
        "max": _group_reduce(np.fmax, sa["max"][is_t], order, starts, n_groups, present, np.nan),
        "min": _group_reduce(np.fmin, sa["min"][is_t], order, starts, n_groups, present, np.nan),
        "norm": _group_reduce(np.fmax, sa["norm"][is_t], order, starts, n_groups, present, np.nan),
    }
    for c in ("nan", "inf"):
        ints = stat_cols[c].fill_null(0).to_numpy(zero_copy_only=False)[is_t].astype("int64")
        red[c] = _group_reduce(np.add, ints, order, starts, n_groups, present, 0)
    return pa.table({
        "module": pa.array([m for m, _ in keys], pa.string()),
        "module_class": pa.array(classes, pa.string()),
        "parent": pa.array(parents, pa.string()),
        "phase": pa.array([p for _, p in keys], pa.string()),
        "records": pa.array(records, pa.int64()),
        "first_seq": pa.array(firsts.astype("int64"), pa.int64()),
        "last_seq": pa.array(last, pa.int64()),
        "tensors": pa.array(n_t, pa.int64()),
        "max": pa.array(red["max"].astype("float64"), pa.float64()),
        "min": pa.array(red["min"].astype("float64"), pa.float64()),
        "norm": pa.array(red["norm"].astype("float64"), pa.float64()),
        "nan": pa.array(red["nan"], pa.int64()),
        "inf": pa.array(red["inf"], pa.int64()),
    })
