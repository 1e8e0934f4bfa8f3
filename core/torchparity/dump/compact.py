"""``torchparity compact DIR``: write the Parquet summaries (:mod:`.columnar`) of a dump that has none.

Idempotent: a (step, rank) whose summaries are present and were made from its current
``records.jsonl`` is left as it is; a missing, stale, truncated or unreadable one is (re)written;
summary partitions of a (step, rank) the dump no longer holds are removed. A damaged
``records.jsonl`` is read as the reader reads it: what could be read is written, and the report
says what was skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from ..errors import DumpError
from ..workers import automatic_workers_allowed, map_jobs
from . import columnar

_PART_RE = re.compile(r"^step=(\d+)$")


@dataclass
class CompactReport:
    """What :func:`compact` did.

    :param written: ``stepS/rankR`` whose summaries were written now.
    :param up_to_date: ``stepS/rankR`` whose summaries were already current (left as they are).
    :param failed: ``stepS/rankR: why`` for units that got no summary (the JSONL serves alone).
    :param skipped: what the reader could not read in a damaged ``records.jsonl`` (one line each).
    :param removed: summary partitions of units the dump no longer holds, removed.
    """

    path: Path
    written: list[str] = field(default_factory=list)
    up_to_date: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    records: int = 0
    seconds: float = 0.0


#: records.jsonl bytes from which compact spreads the units over worker processes (each worker
#: pays ~1-2 s to start: imports; a unit is written at ~30,000 records/s, ~10 MB/s, per core)
PARALLEL_MIN_BYTES = 64 << 20


def compact(path: str | Path, force: bool = False, finished_only: bool = False,
            only: Collection[str] | None = None, workers: int | None = None) -> CompactReport:
    """Write the summaries of every torchparity (step, rank) of the dump at ``path`` (its root).

    :param force: rewrite summaries that are already current.
    :param finished_only: leave out (step, rank)s without ``footer.json``: still being written (a
        summary of them would soon be stale), or their process was killed (``torchparity query``).
    :param only: just these ``stepS/rankR`` (``torchparity query``'s missing or stale ones); the
        clean-up of summaries of units the dump no longer holds and of temporary files left by a
        killed writer is then skipped (another process may be writing them right now).
    :param workers: processes writing units side by side (each unit is independent); None: one
        per core (at most 8) when the units to write hold more than :data:`PARALLEL_MIN_BYTES`
        of records.jsonl and the main module is safe to import again in a worker
        (:func:`torchparity.workers.automatic_workers_allowed`), else 1.
    :raises DumpError: ``path`` holds no dump, is not a dump root, or pyarrow is missing.
    """
    from .reader import open_dump

    t0 = time.perf_counter()
    reader = open_dump(path)
    root = Path(path)
    why = columnar.missing_pyarrow()
    if why:
        raise DumpError(f"cannot write summaries: {why}; install it (pip install pyarrow)")
    units = [u for u in reader.units if u.format == "torchparity"]
    if not units:
        raise DumpError(f"{root} holds no torchparity dump (an msprobe dump has no summaries); nothing to compact")
    if any(columnar.dump_root_of(u) != root for u in units):
        raise DumpError(f"{root} is not a dump root (stepN/rankN directories below it); pass the dump's root directory")
    rep = CompactReport(root)
    todo = []
    for u in units:
        rel = f"step{u.step}/rank{u.rank}"
        if only is not None and rel not in only:
            continue
        if finished_only and not (u.path / "footer.json").is_file():
            rep.failed.append(f"{rel}: no footer.json (still being written, or its process was killed)")
            continue
        if not force and columnar.summary_state(u)[0] == "ok":
            rep.up_to_date.append(rel)
            continue
        if not (u.path / "records.jsonl").is_file():
            rep.failed.append(f"{rel}: no records.jsonl")
            continue
        todo.append(u)
    jobs = [(root, u) for u in todo]
    for (root_, u), (why, scanned, warnings) in zip(jobs, _run(jobs, workers)):
        rel = f"step{u.step}/rank{u.rank}"
        if why is not None:
            rep.failed.append(f"{rel}: {why}")
            continue
        rep.written.append(rel)
        rep.records += scanned
        rep.skipped += warnings
        _mark_footer(u.path / "footer.json")
    if only is not None:
        rep.seconds = time.perf_counter() - t0
        return rep
    have = {(u.step, u.rank) for u in units}
    for table in columnar.TABLES:
        base = columnar.summary_root(root) / table
        for d in sorted(base.glob("step=*/rank=*")) if base.is_dir() else []:
            m, r = _PART_RE.match(d.parent.name), re.fullmatch(r"rank=(\d+)", d.name)
            if m and r and (int(m.group(1)), int(r.group(1))) not in have:
                shutil.rmtree(d, ignore_errors=True)
                rep.removed.append(f"{table}/{d.parent.name}/{d.name}")
    for tmp in columnar.summary_root(root).glob("*/step=*/rank=*/.*.tmp"):  # left by a killed writer
        tmp.unlink(missing_ok=True)
    rep.seconds = time.perf_counter() - t0
    return rep


def _write_one(job: tuple[Path, Any]) -> tuple[str | None, int, list[str]]:
    """Write one unit's summaries: (why not, or None; records read; what the reader skipped)."""
    root, u = job
    try:
        why = columnar.write_unit_summary(root, u)
        if why is not None:
            return why, 0, []
        meta = columnar.read_meta(columnar.part_path(root, "ops", u.step, u.rank))
        return None, int(meta.get("scanned", 0)), [w for w, _ in meta["scan_warnings"] + meta["frame_warnings"]]
    except Exception as exc:  # a worker must report, never take the others down
        return f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}", 0, []


def _run(jobs: list[tuple[Path, Any]], workers: int | None) -> list[tuple[str | None, int, list[str]]]:
    n = len(jobs)
    if workers is None:
        size = 0
        for _, u in jobs:
            try:
                size += (u.path / "records.jsonl").stat().st_size
            except OSError:
                pass
        workers = min(n, os.cpu_count() or 1, 8) if n > 1 and size > PARALLEL_MIN_BYTES \
            and automatic_workers_allowed() else 1
    return map_jobs(_write_one, jobs, workers, chunksize=max(1, n // (4 * max(workers, 1))))


def _mark_footer(path: Path) -> None:
    """A finished unit's ``footer.json`` says its summary is there now (it said
    ``summaries='off'`` or why the writer could not write one). Best effort: the summary's own
    metadata and digest are what the readers trust."""
    from .writer import _atomic_write_json

    try:
        footer = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(footer, dict) and footer.get("summary") is not True:
            footer["summary"] = True
            footer.pop("summary_error", None)
            _atomic_write_json(path, footer)
    except (OSError, ValueError):  # no footer (a killed process), or one the reader reports anyway
        pass

