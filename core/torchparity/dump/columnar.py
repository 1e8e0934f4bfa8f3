"""Columnar summaries: each (step, rank)'s records as Parquet tables, for SQL and a faster compare.

Layout (hive-style partitions, next to the ``stepN/rankN`` directories)::

    DIR/summary/ops/step=S/rank=R/part.parquet       one row per record
    DIR/summary/tensors/step=S/rank=R/part.parquet   one row per tensor entry (argument, result, ...)
    DIR/summary/modules/step=S/rank=R/part.parquet   one row per (module, phase): an aggregate

``step`` and ``rank`` are the partition directories' values (not columns in the files). ``seq`` is
a record's position among the readable records of its ``records.jsonl`` (0-based): ``ops`` and
``tensors`` join on ``(step, rank, seq)``. The JSONL stays the source of truth: a summary is made
by reading ``records.jsonl`` back with the reader's own checks (:class:`~.columns.RecordColumns`),
so it holds exactly what the reader would read, and each file's Parquet metadata carries a
fingerprint of the ``records.jsonl`` it was made from (size, hashes of its first and last 64 KiB)
plus the reader's warnings; a summary whose fingerprint no longer matches is not used.

Files are written under a temporary name and renamed, so a killed process never leaves a half
file under the real name. :func:`write_unit_summary` is called by the dump writer's thread at the
end of each step, and by ``torchparity compact`` (:mod:`.compact`) for older dumps;
:func:`read_compare_frame` hands the compare its columns from the summaries (the JSONL is the
fallback when a summary is missing, stale, truncated or unreadable).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from .columns import COMPARE_COLUMNS, STAT_COLUMNS, RecordColumns, _ints, _NO_STATS, _stat_arrays, empty_frame
from .damage import Damage
from .units import DumpUnit

SUMMARY_DIR = "summary"
TABLES = ("ops", "tensors", "modules")
PART = "part.parquet"
META_KEY = b"torchparity"
SUMMARY_VERSION = 1
_FP_BYTES = 1 << 16
_I64 = 2 ** 63


def missing_pyarrow() -> str | None:
    """None when pyarrow can be imported; else why not (one line)."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"pyarrow is not importable ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
    return None


def summary_root(dump_root: Path) -> Path:
    return Path(dump_root) / SUMMARY_DIR


def part_path(dump_root: Path, table: str, step: int, rank: int) -> Path:
    """Where one table of one (step, rank) lives."""
    return summary_root(dump_root) / table / f"step={int(step)}" / f"rank={int(rank)}" / PART


def dump_root_of(u: DumpUnit) -> Path | None:
    """The dump root of a ``ROOT/stepS/rankR`` unit directory (None for another layout)."""
    p = u.path
    if p.name == f"rank{u.rank}" and p.parent.name == f"step{u.step}":
        return p.parent.parent
    return None


def fingerprint(records: Path) -> dict[str, Any]:
    """Size and hashes of the first and last 64 KiB of ``records.jsonl``: cheap, and survives a copy."""
    with open(records, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_FP_BYTES)
        f.seek(max(0, size - _FP_BYTES))
        tail = f.read(_FP_BYTES)
    return {"size": size, "head": hashlib.blake2b(head, digest_size=16).hexdigest(),
            "tail": hashlib.blake2b(tail, digest_size=16).hexdigest()}


# ---- records.jsonl -> Arrow tables ------------------------------------------------------------


class NotSummarizable(Exception):
    """The unit's values do not fit the Parquet schema losslessly (the JSONL then serves alone)."""


def _scan(u: DumpUnit) -> tuple[RecordColumns, int, list[str]]:
    from .reader import _scan_records

    rel = f"step{u.step}/rank{u.rank}"
    cols = RecordColumns(full=True, step=u.step, rank=u.rank)
    scan_w: list[str] = []
    n = _scan_records(u.path / "records.jsonl", rel, scan_w, cols.add)
    return cols, n, scan_w


def _json_text(v: Any) -> str | None:
    return None if v is None else json.dumps(v)


def _check_ints(values: list[Any], what: str) -> None:
    for v in values:
        if v is not None and not (type(v) is int and -_I64 <= v < _I64):
            raise NotSummarizable(f"{what} {v!r:.40} is not a 64-bit integer")


def unit_tables(u: DumpUnit) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three Arrow tables of one torchparity (step, rank) directory, and the metadata that
    goes with them (fingerprint, record count, the reader's warnings)."""
    import numpy as np
    import pyarrow as pa

    fp = fingerprint(u.path / "records.jsonl")
    cols, n_scanned, scan_w = _scan(u)
    rel = f"step{u.step}/rank{u.rank}"
    bad_full = cols.problems()
    cols.full = False
    bad_compare = cols.problems()  # the compare validates fewer columns: it must drop the same records
    cols.full = True
    frame_w: list[str] = []
    if bad_full:
        frame_w.append(Damage(cols.damage_message(bad_full, f"{rel}/records.jsonl")))
    ids, names, ops, levels, phases, modules, cis, fwds, stacks, cdt = cols.heads
    mcls, _steps, _ranks, flags = cols.xheads
    rec, io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys = cols.cols
    if bad_full:
        keep_rec = [i for i in range(cols.n_records) if i not in bad_full]
        rows = [j for j, i in enumerate(rec) if i not in bad_full]
        seq_of: Any = {i: s for s, i in enumerate(keep_rec)}
    else:  # a clean dump (the usual case): every record and row, a record's seq is its index
        keep_rec, rows, seq_of = list(range(cols.n_records)), list(range(len(rec))), None
    seqs = np.asarray(rec if seq_of is None else [seq_of[rec[j]] for j in rows], dtype="int64")

    def pick(col: list[Any], at: list[int]) -> list[Any]:
        return [col[i] for i in at]

    r_fwd, r_stack = pick(fwds, keep_rec), pick(stacks, keep_rec)
    _check_ints(r_fwd, "fwd")
    _check_ints(r_stack, "stack")
    ops_t = pa.table({
        "seq": pa.array(np.arange(len(keep_rec), dtype="int64")),
        "record_id": pa.array(_ints(ids)[keep_rec] if keep_rec else np.zeros(0, "int64")),
        "name": pa.array(pick(names, keep_rec), pa.string()),
        "op": pa.array(pick(ops, keep_rec), pa.string()),
        "level": pa.array(pick(levels, keep_rec), pa.string()),
        "phase": pa.array(pick(phases, keep_rec), pa.string()),
        "module": pa.array(pick(modules, keep_rec), pa.string()),
        "module_class": pa.array(pick(mcls, keep_rec), pa.string()),
        "call_index": pa.array(_ints(cis)[keep_rec] if keep_rec else np.zeros(0, "int64")),
        "fwd": pa.array(r_fwd, pa.int64()), "stack": pa.array(r_stack, pa.int64()),
        "compute_dtype": pa.array(pick(cdt, keep_rec), pa.string()),
        "collective": pa.array([type(f) is dict and bool(f.get("collective")) for f in pick(flags, keep_rec)]),
        "tensors": pa.array(np.bincount(seqs, minlength=len(keep_rec)).astype("int64")),
        "flags": pa.array([_json_text(f) if f else None for f in pick(flags, keep_rec)], pa.string()),
    })
    t_rec = [rec[j] for j in rows]
    sa = _stat_arrays(pick(stats, rows)) if rows else {c: np.zeros(0) for c in STAT_COLUMNS}
    no_stats = np.array([stats[j] is _NO_STATS for j in rows], dtype=bool)
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
    shapes = [list(s) if s is not None else None for s in pick(shape, rows)]
    strides = [list(s) if s is not None else None for s in pick(stride, rows)]
    prods = [list(p) if type(p) is list and p else None for p in pick(prod, rows)]
    for what, vals in (("shape", pick(shape, rows)), ("stride", pick(stride, rows)), ("producer", prods)):
        for v in {tuple(v) for v in vals if v is not None}:  # shapes are shared: few distinct ones
            _check_ints(list(v), what)
    rg_rows = pick(rg, rows)
    tensors_t = pa.table({
        "seq": pa.array(seqs),
        "record_id": pa.array(_ints(ids)[t_rec] if t_rec else np.zeros(0, "int64")),
        "name": pa.array([names[i] for i in t_rec], pa.string()),
        "op": pa.array([ops[i] for i in t_rec], pa.string()),
        "level": pa.array([levels[i] for i in t_rec], pa.string()),
        "phase": pa.array([phases[i] for i in t_rec], pa.string()),
        "module": pa.array([modules[i] for i in t_rec], pa.string()),
        "io": pa.array(pick(io, rows), pa.string()),
        "arg": pa.array([str(a) for a in pick(arg, rows)], pa.string()),
        "kind": pa.array(pick(kind, rows), pa.string()),
        "dtype": pa.array(pick(dtype, rows), pa.string()),
        "shape": pa.array(shapes, pa.list_(pa.int64())),
        "stride": pa.array(strides, pa.list_(pa.int64())),
        "device": pa.array(pick(cols.device, rows), pa.string()),
        "requires_grad": pa.array(rg_rows, pa.bool_()),
        **stat_cols,
        "md5": pa.array(pick(md5, rows), pa.string()),
        "value": pa.array([_json_text(v) for v in pick(value, rows)], pa.string()),
        "producer": pa.array(prods, pa.list_(pa.int64())),
        "file": pa.array(pick(files, rows), pa.string()),
        "key": pa.array(pick(keys, rows), pa.string()),
    })
    modules_t = _module_table(u, ops_t, tensors_t)
    meta = {"version": SUMMARY_VERSION, "records_jsonl": fp, "scanned": n_scanned, "step": u.step, "rank": u.rank,
            "scan_warnings": [[str(w), isinstance(w, Damage)] for w in scan_w],
            "frame_warnings": [[str(w), True] for w in frame_w],
            # the compare's own checks drop exactly these records too: its frame can come from here
            "compare_ok": set(bad_full) == set(bad_compare),
            "requires_grad_all_bool": all(type(v) is bool for v in rg)}
    return {"ops": ops_t, "tensors": tensors_t, "modules": modules_t}, meta


def _module_table(u: DumpUnit, ops_t: Any, tensors_t: Any) -> Any:
    """One row per (module, phase) of this (step, rank): the records whose ``module`` is that path
    (directly, not its sub-modules) and the statistics of their tensor values."""
    import pandas as pd
    import pyarrow as pa

    from .reader import _iter_jsonl

    tree = {m.get("path"): m for m in _iter_jsonl(u.path / "modules.jsonl", []) if isinstance(m, dict)}
    o = ops_t.select(["seq", "module", "phase", "module_class", "level"]).to_pandas()
    t = tensors_t.select(["module", "phase", "kind", "max", "min", "norm", "nan", "inf"]).to_pandas()
    t = t[t["kind"] == "tensor"]
    keys = ["module", "phase"]
    if len(o):
        agg = o.groupby(keys, sort=False).agg(records=("seq", "size"), first_seq=("seq", "min"),
                                              last_seq=("seq", "max")).reset_index()
        cls = o[o["level"] == "module"].groupby(keys, sort=False)["module_class"].first()
        agg["module_class"] = [cls.get((m, p)) for m, p in zip(agg["module"], agg["phase"])]
    else:
        agg = pd.DataFrame({c: pd.Series(dtype=d) for c, d in
                            (("module", object), ("phase", object), ("records", "int64"), ("first_seq", "int64"),
                             ("last_seq", "int64"), ("module_class", object))})
    st = t.groupby(keys, sort=False).agg(tensors=("kind", "size"), max=("max", "max"), min=("min", "min"),
                                         norm=("norm", "max"), nan=("nan", "sum"), inf=("inf", "sum")).reset_index()
    agg = agg.merge(st, on=keys, how="left")
    classes = [c if isinstance(c, str) else (tree.get(m) or {}).get("class") for m, c in zip(agg["module"], agg["module_class"])]
    return pa.table({
        "module": pa.array(agg["module"].tolist(), pa.string()),
        "module_class": pa.array([c if isinstance(c, str) else None for c in classes], pa.string()),
        "parent": pa.array([(tree.get(m) or {}).get("parent") if isinstance((tree.get(m) or {}).get("parent"), str)
                            else None for m in agg["module"]], pa.string()),
        "phase": pa.array(agg["phase"].tolist(), pa.string()),
        "records": pa.array(agg["records"].astype("int64").tolist(), pa.int64()),
        "first_seq": pa.array(agg["first_seq"].astype("int64").tolist(), pa.int64()),
        "last_seq": pa.array(agg["last_seq"].astype("int64").tolist(), pa.int64()),
        "tensors": pa.array(agg["tensors"].fillna(0).astype("int64").tolist(), pa.int64()),
        "max": pa.array(agg["max"].astype("float64").tolist(), pa.float64()),
        "min": pa.array(agg["min"].astype("float64").tolist(), pa.float64()),
        "norm": pa.array(agg["norm"].astype("float64").tolist(), pa.float64()),
        "nan": pa.array(agg["nan"].fillna(0).astype("int64").tolist(), pa.int64()),
        "inf": pa.array(agg["inf"].fillna(0).astype("int64").tolist(), pa.int64()),
    })


# ---- writing --------------------------------------------------------------------------------


def _write_atomic(table: Any, path: Path, meta: dict[str, Any], fsync: bool) -> Path:
    """Write ``table`` to a temporary name beside ``path``; returns that name (renamed by the caller)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    try:
        pq.write_table(table, tmp, compression="zstd")
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return tmp


def write_unit_summary(dump_root: Path, u: DumpUnit, fsync: bool = False) -> str | None:
    """Write the three summary tables of one torchparity (step, rank) directory.

    Returns None when written, else why not (one line; nothing half-written is left behind).
    Never raises for bad data: the JSONL serves alone then."""
    why = missing_pyarrow()
    if why:
        return why
    if not (u.path / "records.jsonl").is_file():
        return "no records.jsonl"
    try:
        tables, meta = unit_tables(u)
    except NotSummarizable as exc:
        return f"the records do not fit the summary schema ({exc})"
    temps: list[tuple[Path, Path]] = []
    try:
        for name in TABLES:
            dest = part_path(dump_root, name, u.step, u.rank)
            temps.append((_write_atomic(tables[name], dest, dict(meta, table=name), fsync), dest))
        for tmp, dest in temps:
            os.replace(tmp, dest)
    except OSError as exc:
        for tmp, _ in temps:
            try:
                tmp.unlink()
            except OSError:
                pass
        return f"cannot write {SUMMARY_DIR}/ ({exc.strerror or exc})"
    return None


def footer_fields(dump_root: Path, step: int, rank: int, rank_dir: Path, fsync: bool) -> dict[str, Any]:
    """What ``footer.json`` says about the summaries of a (step, rank) the writer just closed:
    ``{"summary": true}``, or ``{"summary": false, "summary_error": why}``. Never raises (the
    writer thread must never stop the user's training)."""
    try:
        why = write_unit_summary(dump_root, DumpUnit(step, rank, rank_dir, "torchparity"), fsync)
    except Exception as exc:  # pragma: no cover - a bug here must not cost the dump
        why = f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    return {"summary": True} if why is None else {"summary": False, "summary_error": why}


def remove_rank_summaries(dump_root: Path, rank: int) -> None:
    """Remove every summary partition of ``rank`` (a new run replaces that rank's data)."""
    import shutil

    for name in TABLES:
        base = summary_root(dump_root) / name
        if base.is_dir():
            for d in base.glob(f"step=*/rank={int(rank)}"):
                shutil.rmtree(d, ignore_errors=True)


# ---- reading (the compare) --------------------------------------------------------------------


def read_meta(path: Path) -> dict[str, Any]:
    """The torchparity metadata of one summary file (raises OSError/ValueError/ArrowException)."""
    import pyarrow.parquet as pq

    md = pq.read_schema(path).metadata or {}
    return json.loads(md[META_KEY])


def summary_state(u: DumpUnit, tables: tuple[str, ...] = TABLES) -> tuple[str, str | None]:
    """``("ok", None)``, ``("absent", None)`` or ``("bad", why)`` for one unit's summaries."""
    root = dump_root_of(u)
    if root is None:
        return "absent", None
    paths = [part_path(root, t, u.step, u.rank) for t in tables]
    if not any(p.is_file() for p in paths):
        return "absent", None
    rec = u.path / "records.jsonl"
    try:
        fp = fingerprint(rec)
    except OSError:
        return "bad", f"cannot read {rec}"
    for p in paths:
        if not p.is_file():
            return "bad", f"{p} is missing"
        try:
            meta = read_meta(p)
        except Exception as exc:  # truncated, not Parquet, no metadata
            return "bad", f"{p} is unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
        if meta.get("version") != SUMMARY_VERSION or meta.get("records_jsonl") != fp:
            return "bad", f"{p} was made from another records.jsonl (stale)"
    return "ok", None


def _objects(col: Any) -> Any:
    """An object ndarray of a string/int column, equal values sharing one object (as the reader's)."""
    import numpy as np

    vals = col.to_pylist()
    shared: dict[Any, Any] = {}
    return np.fromiter((v if v is None else shared.setdefault(v, v) for v in vals), dtype=object, count=len(vals))


def read_compare_frame(u: DumpUnit, warnings: list[str]) -> Any | None:
    """The compare's frame (:data:`COMPARE_COLUMNS`) of one unit from its summaries, with the same
    warnings the JSONL would give; None when the JSONL must be read (no summary: silently; a
    summary that is stale, truncated or unreadable: with a one-line note in ``warnings``)."""
    if missing_pyarrow():
        return None
    state, why = summary_state(u, ("ops", "tensors"))
    if state == "absent":
        return None
    if state == "bad":
        warnings.append(f"{why}; read step{u.step}/rank{u.rank}/records.jsonl instead "
                        f"(`torchparity compact` rewrites the summaries)")
        return None
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .reader import footer_problems
    from .tensors import TensorRef

    root = dump_root_of(u)
    assert root is not None
    tp = part_path(root, "tensors", u.step, u.rank)
    try:
        meta = read_meta(tp)
        if not meta.get("compare_ok"):
            return None
        ops = pq.read_table(part_path(root, "ops", u.step, u.rank),
                            columns=["record_id", "name", "op", "level", "phase", "module", "call_index", "fwd",
                                     "stack", "compute_dtype"])
        t = pq.read_table(tp, columns=["seq", "io", "arg", "kind", "dtype", "shape", "requires_grad", *STAT_COLUMNS,
                                       "md5", "value", "producer", "file", "key"])
    except Exception as exc:  # truncated or damaged after the check
        warnings.append(f"{tp.parent} holds an unreadable summary ({type(exc).__name__}); read "
                        f"step{u.step}/rank{u.rank}/records.jsonl instead (`torchparity compact` rewrites it)")
        return None
    rel = f"step{u.step}/rank{u.rank}"
    for text, is_damage in meta["scan_warnings"]:
        warnings.append(Damage(text) if is_damage else text)
    warnings.extend(footer_problems(u.path, rel, int(meta["scanned"])))
    for text, _ in meta["frame_warnings"]:
        warnings.append(Damage(text))
    n = t.num_rows
    if not n:
        return empty_frame()[COMPARE_COLUMNS]
    at = t.column("seq").to_numpy()
    data: dict[str, Any] = {}
    for c in ("name", "op", "level", "phase", "module", "compute_dtype", "fwd", "stack"):
        data[c] = _objects(ops.column(c))[at]
    data["record_id"] = ops.column("record_id").to_numpy()[at]
    data["call_index"] = ops.column("call_index").to_numpy()[at]
    for c in ("io", "arg", "kind", "dtype", "md5"):
        data[c] = _objects(t.column(c))
    shared: dict[Any, Any] = {}
    data["shape"] = np.fromiter((None if s is None else shared.setdefault(tuple(s), tuple(s))
                                 for s in t.column("shape").to_pylist()), dtype=object, count=n)
    rg = t.column("requires_grad").to_pylist()
    data["requires_grad"] = np.array(rg, dtype=bool) if meta.get("requires_grad_all_bool") else \
        np.fromiter(rg, dtype=object, count=n)
    for c in STAT_COLUMNS:  # no statistics (null): NaN, as the JSONL reader gives
        col = t.column(c).cast(pa.float64())
        data[c] = np.asarray(col.fill_null(math.nan).to_numpy(), dtype="float64")
    data["value"] = np.fromiter((None if v is None else json.loads(v) for v in t.column("value").to_pylist()),
                                dtype=object, count=n)
    data["producer"] = np.fromiter((None if p is None else tuple(p) for p in t.column("producer").to_pylist()),
                                   dtype=object, count=n)
    tensor: list[Any] = [None] * n
    files, keys = t.column("file").to_pylist(), t.column("key").to_pylist()
    if any(files):
        refs: dict[str, Path] = {}
        for j, f in enumerate(files):
            if f:
                fp = refs.get(f)
                if fp is None:
                    fp = refs[f] = u.path / f
                tensor[j] = TensorRef(fp, keys[j])
    data["tensor"] = np.fromiter(tensor, dtype=object, count=n)
    return pd.DataFrame({c: pd.Series(data[c], dtype=data[c].dtype, copy=False) for c in COMPARE_COLUMNS}, copy=False)
