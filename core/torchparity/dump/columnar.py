"""Columnar summaries: each (step, rank)'s records as Parquet tables, for SQL and a faster compare.

Layout (hive-style partitions, next to the ``stepN/rankN`` directories)::

    DIR/summary/ops/step=S/rank=R/part.parquet       one row per record
    DIR/summary/tensors/step=S/rank=R/part.parquet   one row per tensor entry (argument, result, ...)
    DIR/summary/modules/step=S/rank=R/part.parquet   one row per (module, phase): an aggregate

``step`` and ``rank`` are the partition directories' values (not columns in the files). ``seq`` is
a record's position among the readable records of its ``records.jsonl`` (0-based): ``ops`` and
``tensors`` join on ``(step, rank, seq)``. The JSONL stays the source of truth: a summary holds
exactly what the reader would read (:func:`.summary_tables.build_tables` validates with the reader's
own checks), built either from the record objects the dump writer has just written
(:mod:`.summary_live`) or by reading ``records.jsonl`` back (:func:`unit_tables`, for ``torchparity
compact``); each file's Parquet metadata carries a fingerprint of that ``records.jsonl`` (size,
hashes of its first and last 64 KiB) plus the reader's warnings; a summary whose fingerprint no
longer matches is not used. Beside each file, ``part.parquet.xxh3`` holds the XXH3-128 digest of its
bytes: Parquet has no checksum of its own by default, and a flipped byte can leave a readable file
with other values (a fuzz run found an op name and a producer link changed that way, compared as
"agree"); a file that no longer matches its digest is not used (the compare reads records.jsonl).

Files are written under a temporary name and renamed, so a killed process never leaves a half
file under the real name. :func:`write_tables` is called by the dump writer's thread (``summaries="step"``: at the
end of each step; ``"close"``: at the dump's close), :func:`write_unit_summary` by ``torchparity
compact`` (:mod:`.compact`) for older dumps and by the writer for a file it did not write whole;
:func:`read_compare_frame` hands the compare its columns from the summaries (the JSONL is the
fallback when a summary is missing, stale, truncated or unreadable).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from .columns import COMPARE_COLUMNS, STAT_COLUMNS, RecordColumns, empty_frame
from .damage import Damage
from .summary_tables import SUMMARY_VERSION, NotSummarizable, build_tables  # noqa: F401 (re-exported)
from .units import DumpUnit

SUMMARY_DIR = "summary"
TABLES = ("ops", "tensors", "modules")
PART = "part.parquet"
CANNOT_WRITE = f"cannot write {SUMMARY_DIR}/"  # how a failed write's reason starts (the disk, not the data)
META_KEY = b"torchparity"
FP_BYTES = 1 << 16  # the fingerprint hashes the first and the last FP_BYTES of records.jsonl
DIGEST_SUFFIX = ".xxh3"  # part.parquet.xxh3: the XXH3-128 hex digest of part.parquet's bytes


def missing_pyarrow() -> str | None:
    """None when pyarrow can be imported; else why not (one line)."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"pyarrow is not importable ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
    return None


def preload() -> None:
    """Import pyarrow (with its pandas bridge) now, while the interpreter is fully alive.

    A dump closed at interpreter exit (a script that ends with ``SystemExit``, ``torchparity run``)
    writes its last summaries from an atexit handler; pyarrow imported there for the first time
    cannot start its helper threads and crashed the process (SIGSEGV, exit code -11) with pyarrow
    10 and torch 2.1. The writer calls this when it starts."""
    if missing_pyarrow() is None:
        try:
            import pyarrow

            pyarrow.lib._pandas_api.have_pandas  # noqa: B018 - imports the pandas bridge now
        except Exception:  # pragma: no cover - a private name moved: the import above is what matters
            pass


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
        head = f.read(FP_BYTES)
        f.seek(max(0, size - FP_BYTES))
        tail = f.read(FP_BYTES)
    return {"size": size, "head": hashlib.blake2b(head, digest_size=16).hexdigest(),
            "tail": hashlib.blake2b(tail, digest_size=16).hexdigest()}


# ---- records.jsonl -> Arrow tables ------------------------------------------------------------


def _scan(u: DumpUnit) -> tuple[RecordColumns, int, list[str]]:
    from .jsonl_scan import _scan_records

    rel = f"step{u.step}/rank{u.rank}"
    cols = RecordColumns(full=True, step=u.step, rank=u.rank)
    scan_w: list[str] = []
    n = _scan_records(u.path / "records.jsonl", rel, scan_w, cols.add)
    return cols, n, scan_w


def module_tree(lines: Iterable[Any]) -> dict[Any, Any]:
    """``modules.jsonl``'s entries by module path (the last entry of a path wins)."""
    return {m.get("path"): m for m in lines if isinstance(m, dict)}


def unit_tables(u: DumpUnit) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three Arrow tables of one torchparity (step, rank) directory, read back from its
    ``records.jsonl`` (``torchparity compact``), and the metadata that goes with them
    (fingerprint, record count, the reader's warnings)."""
    from .jsonl_scan import _iter_jsonl

    fp = fingerprint(u.path / "records.jsonl")
    cols, n_scanned, scan_w = _scan(u)
    tree = module_tree(_iter_jsonl(u.path / "modules.jsonl", []))
    return build_tables(cols, n_scanned, scan_w, fp, u.step, u.rank, tree)


# ---- writing --------------------------------------------------------------------------------


def digest_path(path: Path) -> Path:
    """Where the digest of the summary file ``path`` lives (``part.parquet.xxh3``)."""
    return path.with_name(path.name + DIGEST_SUFFIX)


def file_digest(path: Path) -> str:
    """XXH3-128 hex digest of a file's bytes (raises OSError)."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(table: Any, path: Path, meta: dict[str, Any], fsync: bool) -> list[tuple[Path, Path]]:
    """Write ``table`` and its digest to temporary names beside ``path``; returns the
    (temporary, final) pairs, renamed by the caller.

    The Parquet bytes are made in memory and hashed there: one ``write`` per file, no second read
    of the file for its digest (some 200 bytes per record: ~10 MB for a 50,000-record (step, rank))."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    dest_digest = digest_path(path)
    tmp_digest = dest_digest.with_name(f".{dest_digest.name}.{os.getpid()}.tmp")
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = memoryview(sink.getvalue())
    try:
        for f, content in ((tmp, data), (tmp_digest, (xxhash.xxh3_128_hexdigest(data) + "\n").encode())):
            with open(f, "wb") as fh:
                fh.write(content)
                if fsync:
                    os.fsync(fh.fileno())
    except BaseException:
        for f in (tmp, tmp_digest):
            try:
                f.unlink()
            except OSError:
                pass
        raise
    return [(tmp, path), (tmp_digest, dest_digest)]


def write_tables(dump_root: Path, step: int, rank: int,
                 make: Callable[[], tuple[dict[str, Any], dict[str, Any]]], fsync: bool = False) -> str | None:
    """Write the three summary tables ``make()`` gives for one (step, rank), atomically.

    Returns None when written, else why not (one line; nothing half-written is left behind)."""
    why = missing_pyarrow()
    if why:
        return why
    try:
        tables, meta = make()
    except NotSummarizable as exc:
        return f"the records do not fit the summary schema ({exc})"
    except Exception as exc:  # a value pyarrow refuses (a lone surrogate in a name, ...): the JSONL serves
        return f"the records could not be summarized ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    temps: list[tuple[Path, Path]] = []
    try:
        for name in TABLES:
            dest = part_path(dump_root, name, step, rank)
            temps += _write_atomic(tables[name], dest, dict(meta, table=name), fsync)
        for tmp, dest in temps:
            os.replace(tmp, dest)
    except Exception as exc:  # OSError (disk full, read-only), or pyarrow refusing a value
        for tmp, _ in temps:
            try:
                tmp.unlink()
            except OSError:
                pass
        if isinstance(exc, OSError):
            return f"{CANNOT_WRITE} ({exc.strerror or exc})"
        return f"the records could not be summarized ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    return None


def write_unit_summary(dump_root: Path, u: DumpUnit, fsync: bool = False) -> str | None:
    """Write the three summary tables of one torchparity (step, rank) directory, read back from
    its ``records.jsonl``. Returns None when written, else why not (one line; nothing
    half-written is left behind). Never raises for bad data: the JSONL serves alone then."""
    why = missing_pyarrow()
    if why:
        return why
    if not (u.path / "records.jsonl").is_file():
        return "no records.jsonl"
    return write_tables(dump_root, u.step, u.rank, lambda: unit_tables(u), fsync)


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
    """``("ok", None)``, ``("absent", None)`` or ``("bad", why)`` for one unit's summaries
    (summaries without digest files, written before the digests existed, count as absent)."""
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
        if not digest_path(p).is_file():  # written before the digests existed: the JSONL, silently
            return "absent", None
        why = _digest_problem(p)
        if why:
            return "bad", why
    return "ok", None


def _digest_problem(p: Path) -> str | None:
    """None when the summary file ``p`` matches its ``.xxh3`` digest; else why not (one line)."""
    dp = digest_path(p)
    try:
        want = dp.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return f"{p} has no digest file {dp.name}"
    except OSError as exc:
        return f"cannot read {dp} ({exc.strerror or exc})"
    try:
        got = file_digest(p)
    except OSError as exc:
        return f"cannot read {p} ({exc.strerror or exc})"
    if got != want:
        return f"{p} does not match its digest {dp.name} (changed or damaged after it was written)"
    return None


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

    from .footer import read_footer
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
    warnings.extend(read_footer(u.path, rel, int(meta["scanned"])).problems)
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
