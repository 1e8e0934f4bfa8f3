"""``torchparity.query(DIR, SQL)``: DuckDB SQL over a dump's Parquet summaries (:mod:`.columnar`).

One view per table, every step and rank at once, read straight from the hive-partitioned
Parquet files (no tensor and no ``records.jsonl`` is read)::

    ops      one row per record          (step, rank, seq, record_id, name, op, level, phase, module, ...)
    tensors  one row per tensor entry    (step, rank, seq, record_id, name, op, ..., io, arg, dtype, shape,
                                          max, min, mean, norm, nan, inf, md5, ...)
    modules  one row per (module, phase) (step, rank, module, module_class, parent, phase, records,
                                          first_seq, last_seq, tensors, max, min, norm, nan, inf)

``step`` and ``rank`` come from the partition directories (cast to BIGINT in the views).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ..errors import DumpError, UsageError
from . import columnar

log = logging.getLogger("torchparity")


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _parts(root: Path, table: str) -> list[Path]:
    base = columnar.summary_root(root) / table
    return sorted(base.glob(f"step=*/rank=*/{columnar.PART}")) if base.is_dir() else []


def _unit_of(part: Path) -> str:
    """``stepS/rankR`` of a summary file ``.../step=S/rank=R/part.parquet``."""
    return f"step{part.parent.parent.name[5:]}/rank{part.parent.name[5:]}"


def missing_units(root: Path) -> list[str]:
    """``stepS/rankR`` directories of the dump that have no summary (a cheap check: file presence)."""
    return sorted(u for u, stale in _units(root).items() if stale is None)


def _units(root: Path) -> dict[str, bool | None]:
    """Every ``stepS/rankR`` with a records.jsonl: None when a summary file is missing; else
    whether records.jsonl changed after its ``ops`` summary was written (modification times: a
    dump appended to after a query, a unit summarized while it was still being written).
    Cheap: a few ``stat`` calls per unit; compact then checks such a unit's fingerprint exactly."""
    out: dict[str, bool | None] = {}
    for sd in root.iterdir():
        m = re.fullmatch(r"step(\d+)", sd.name)
        if not (m and sd.is_dir()):
            continue
        for rd in sd.iterdir():
            r = re.fullmatch(r"rank(\d+)", rd.name)
            if not r:
                continue
            try:
                rec = (rd / "records.jsonl").stat().st_mtime_ns
            except OSError:
                continue
            step, rank = int(m.group(1)), int(r.group(1))
            try:
                parts = [columnar.part_path(root, t, step, rank).stat().st_mtime_ns for t in columnar.TABLES]
            except OSError:
                out[f"step{step}/rank{rank}"] = None
                continue
            out[f"step{step}/rank{rank}"] = rec > min(parts)
    return out


def connect(path: str | Path) -> Any:
    """A DuckDB connection with the views ``ops``, ``tensors`` and ``modules`` over the dump at
    ``path`` (its root).

    A dump written with ``summaries="off"`` (the default: no Parquet work while training) gets its
    summaries here, on its first query: :func:`.compact.compact` writes those of every finished
    (step, rank) that has none (one log line says so). A (step, rank) without ``footer.json`` (still
    being written, or its process was killed) is left out with a one-line warning, as is one whose
    summary could not be written.

    :raises DumpError: no summaries could be had (the message says why), or duckdb is missing.
    """
    root = Path(path)
    if not root.is_dir():
        raise DumpError(f"dump {root} does not exist or is not a directory; pass a dump root (torchparity run -o DIR)")
    try:
        import duckdb
    except ImportError as exc:
        raise DumpError(f"torchparity query needs duckdb ({exc}); install it (pip install duckdb)") from None
    units = _units(root)
    todo = [u for u, stale in units.items() if stale is None or stale]
    missing: list[str] = []
    failed: list[str] = []
    if todo:
        missing, failed = _write_missing(root, todo)
    left_out = set(missing)  # a stale summary of a unit that could not be rewritten is not read either
    files = {t: [p for p in _parts(root, t) if _unit_of(p) not in left_out] for t in columnar.TABLES}
    if not all(files.values()):
        why = f" and they could not be written ({failed[0]}{' ...' if len(failed) > 1 else ''})" if failed else ""
        fix = (f"copy the dump to a writable place and query the copy (or run torchparity compact on it)"
               if any(columnar.CANNOT_WRITE in f for f in failed) else f"write them with: torchparity compact {root}")
        raise DumpError(f"{root} has no Parquet summaries ({columnar.SUMMARY_DIR}/ops, tensors, modules){why}; {fix}")
    if missing:
        log.warning("%s: %d step/rank director%s without a current summary (%s%s) are not in the query; "
                    "run torchparity compact %s", root, len(missing), "y" if len(missing) == 1 else "ies",
                    ", ".join(missing[:3]), " ..." if len(missing) > 3 else "", root)
    con = duckdb.connect(":memory:")
    for t, paths in files.items():
        listing = ", ".join(_sql_string(str(p)) for p in paths)
        con.execute(f"CREATE VIEW {t} AS SELECT * REPLACE (CAST(step AS BIGINT) AS step, CAST(rank AS BIGINT) AS rank) "
                    f"FROM read_parquet([{listing}], hive_partitioning=true)")
    return con


def _write_missing(root: Path, todo: list[str]) -> tuple[list[str], list[str]]:
    """Write the summaries of the finished units among ``todo`` (missing or stale:
    ``torchparity compact``'s work on them alone); returns those still without a current one,
    and why (``stepS/rankR: why``)."""
    from .compact import compact

    try:
        rep = compact(root, finished_only=True, only=set(todo))
    except DumpError as exc:
        raise DumpError(f"{root}: {len(todo)} step/rank(s) have no current Parquet summaries and they cannot be "
                        f"written here ({exc})") from None
    if rep.written:
        log.warning("wrote the Parquet summaries of %d step/rank(s) of %s first (%d records, %.1f s; "
                    "dumps are written with summaries='off' unless asked, the next query starts at once)",
                    len(rep.written), root, rep.records, rep.seconds)
    bad = {f.split(":", 1)[0] for f in rep.failed}
    return sorted(u for u in todo if u in bad), rep.failed


def query(path: str | Path, sql: str) -> Any:
    """Run ``sql`` (DuckDB SQL over the views ``ops``, ``tensors``, ``modules``) on the dump at
    ``path``; returns a pandas DataFrame.

    :raises DumpError: the dump has no summaries, or a summary file is damaged (run ``torchparity
        compact DIR``, which rewrites it from the JSONL).
    :raises UsageError: the SQL is wrong (the message is DuckDB's, on one line).
    """
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise UsageError("the query is empty; pass a SQL statement such as \"SELECT count(*) FROM ops\"")
    con = connect(path)
    try:
        return con.execute(sql).df()
    except duckdb.Error as exc:
        text = " ".join(str(exc).split())
        summary_dir = str(columnar.summary_root(Path(path)))
        if summary_dir in text or type(exc).__name__ in ("IOException", "InvalidInputException") and ".parquet" in text:
            raise DumpError(f"a summary file of {path} is damaged ({text[:300]}); rewrite the summaries with: "
                            f"torchparity compact {path}") from None
        raise UsageError(f"the query failed: {text[:400]} (tables: ops, tensors, modules; see docs/query.md)") from None
    finally:
        con.close()


#: the documented queries (docs/query.md; timed by bench/bench_query.py)
EXAMPLE_QUERIES: dict[str, str] = {
    "largest max per module across ranks":
        "SELECT module, max(max) AS largest, arg_max(rank, max) AS rank, arg_max(step, max) AS step "
        "FROM modules WHERE module <> '' AND isfinite(max) GROUP BY module ORDER BY largest DESC LIMIT 5",
    "first step with a NaN on any rank":
        "SELECT step, rank, min(seq) AS first_seq, arg_min(name, seq) AS first_op, count(*) AS values_with_nan "
        "FROM tensors WHERE nan > 0 GROUP BY step, rank ORDER BY step, first_seq, rank LIMIT 5",
    "ranks whose loss differs":
        "WITH loss AS (SELECT step, rank, mean AS loss FROM tensors WHERE op = 'torch.nn.functional.cross_entropy' "
        "AND io = 'output' AND phase = 'forward'), usual AS (SELECT step, mode(loss) AS usual FROM loss GROUP BY step) "
        "SELECT step, rank, loss, usual FROM loss JOIN usual USING (step) WHERE loss IS DISTINCT FROM usual "
        "ORDER BY step, rank",
    "first op whose output differs between ranks":
        "SELECT step, name, arg, min(seq) AS seq, min(max) AS lowest_max, max(max) AS highest_max, "
        "arg_max(rank, max) AS rank_of_highest FROM tensors WHERE io = 'output' "
        "GROUP BY step, name, arg HAVING min(max) <> max(max) ORDER BY step, seq LIMIT 3",
    "records per step across ranks":
        "SELECT step, count(*) AS ranks, min(n) AS fewest_records, max(n) AS most_records "
        "FROM (SELECT step, rank, count(*) AS n FROM ops GROUP BY step, rank) GROUP BY step ORDER BY step",
}
