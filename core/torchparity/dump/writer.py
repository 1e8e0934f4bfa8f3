"""The dump writer: append-only JSON Lines and safetensors batches, written off the training thread.

The training thread hands over complete batches (records plus a stacked tensor of their
statistics, plus CPU copies of tensors in tensor mode). A single worker thread brings the
statistics to the host in one transfer, writes tensor files atomically (temp name, then rename),
then appends the records that reference them and flushes. A process killed at any moment leaves
everything up to the last complete batch readable. Errors (disk full, permissions) never stop the
user's training: the writer logs one clear message, stops writing, and marks the dump incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..records import FORMAT_NAME, FORMAT_VERSION, OpRecord, TensorEntry
from ..capture.stats import stats_to_dict

log = logging.getLogger("torchparity")

try:  # orjson encodes records ~5x faster than json.dumps; the writer thread then holds the GIL less
    from orjson import dumps as _orjson_dumps

    def _record_line(d: dict[str, Any]) -> str:
        return _orjson_dumps(d).decode() + "\n"
except ImportError:  # pragma: no cover - orjson is a dependency; stay usable without it
    def _record_line(d: dict[str, Any]) -> str:
        return json.dumps(d, allow_nan=False) + "\n"


@dataclass
class Batch:
    step: int
    rank: int
    records: list[OpRecord]
    stat_slots: list[TensorEntry]  # entries whose stats are rows of `stats`, in order
    stats: torch.Tensor | None  # [n, 6] on the device
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> CPU tensor
    tensor_owner: dict[str, TensorEntry] = field(default_factory=dict)
    nbytes: int = 0
    # entries whose value equals a tensor saved for another entry (this batch or earlier in the
    # step): they get that tensor's file, or no file if it was not saved (max_bytes)
    tensor_refs: list[TensorEntry] = field(default_factory=list)


@dataclass
class _RankFiles:
    dir: Path
    records: Any
    stacks: Any
    modules: Any
    n_records: int = 0
    n_tensor_files: int = 0
    tensor_bytes: int = 0
    dropped_tensors: int = 0
    saved_tensors: dict[str, str] = field(default_factory=dict)  # tensor key -> its file


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)


_OPENED_IN_THIS_PROCESS: set[tuple[str, int]] = set()


def replace_previous_run(root: Path, rank: int) -> int:
    """Remove this rank's data left in ``root`` by an earlier run (records are appended, so a
    re-run into the same directory would otherwise mix two runs). Only directories named
    ``step<N>/rank<rank>`` inside a torchparity dump are touched; other ranks clean their own.
    Returns how many rank directories were removed."""
    key = (str(root.resolve()), rank)
    if key in _OPENED_IN_THIS_PROCESS:  # started again in the same process: keep appending
        return 0
    _OPENED_IN_THIS_PROCESS.add(key)
    if not (root / "torchparity.json").is_file():
        return 0
    removed = 0
    for step_dir in root.iterdir():
        if not (step_dir.is_dir() and re.fullmatch(r"step\d+", step_dir.name)):
            continue
        rank_dir = step_dir / f"rank{rank}"
        if rank_dir.is_dir():
            shutil.rmtree(rank_dir, ignore_errors=True)
            removed += 1
        try:
            step_dir.rmdir()  # only when no other rank is left in it
        except OSError:
            pass
    if removed:
        log.warning("%s held an earlier dump of rank %d (%d step(s)): replaced by this run", root, rank, removed)
    return removed


class DumpWriter:
    """Writes one dump directory. Thread-safe for one producer (the training thread) per rank."""

    def __init__(self, root: str | os.PathLike[str], header: dict[str, Any], *, fsync: bool = True,
                 max_bytes: int | None = None, max_queue_bytes: int = 1 << 30, rank: int | None = None) -> None:
        self.root = Path(root)
        self.header = header
        self.fsync = fsync
        self.max_bytes = max_bytes
        self.max_queue_bytes = max_queue_bytes
        self.error: str | None = None
        self.budget_exhausted = False
        self._files: dict[tuple[int, int], _RankFiles] = {}
        self._queue: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._total_tensor_bytes = 0
        self._module_lines: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._run, name="torchparity-writer", daemon=True)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if rank is not None:
                replace_previous_run(self.root, rank)
            _atomic_write_json(self.root / "torchparity.json", {
                "format": FORMAT_NAME, "version": FORMAT_VERSION, "tool_version": header.get("tool_version"),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            })
        except OSError as exc:
            from ..errors import DumpError

            raise DumpError(f"cannot create dump directory {self.root}: {exc.strerror or exc}; choose a writable path") from None
        self._thread.start()

    # ---- producer side (training thread) --------------------------------------------------
    def submit(self, batch: Batch) -> None:
        if self.error:
            return
        if batch.tensors:
            with self._cond:
                while self._queued_bytes + batch.nbytes > self.max_queue_bytes and self._queued_bytes > 0 and not self.error:
                    self._cond.wait(timeout=1.0)  # back-pressure: bounded host memory
                self._queued_bytes += batch.nbytes
        self._queue.put(("batch", batch))

    def add_stack(self, step: int, rank: int, sid: int, frames: list[str]) -> None:
        self._queue.put(("stack", (step, rank, sid, frames)))

    def add_modules(self, entries: list[tuple[str, str, str | None]]) -> None:
        self._queue.put(("modules", entries))

    def end_step(self, step: int) -> None:
        self._queue.put(("end_step", step))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is on disk."""
        if not self._thread.is_alive():  # closed (or died): everything it will ever write is written
            return
        done = threading.Event()
        self._queue.put(("barrier", done))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.wait(0.5):
            if not self._thread.is_alive() or (deadline is not None and time.monotonic() > deadline):
                return

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._queue.put(("close", None))
        self._thread.join()

    # ---- worker side -------------------------------------------------------------------------
    def _rank_files(self, step: int, rank: int) -> _RankFiles:
        key = (step, rank)
        rf = self._files.get(key)
        if rf is None:
            d = self.root / f"step{step}" / f"rank{rank}"
            d.mkdir(parents=True, exist_ok=True)
            header = dict(self.header, step=step, rank=rank,
                          created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          pid=os.getpid(), hostname=socket.gethostname())
            _atomic_write_json(d / "header.json", header)
            rf = _RankFiles(d, open(d / "records.jsonl", "a", encoding="utf-8"),
                            open(d / "stacks.jsonl", "a", encoding="utf-8"),
                            open(d / "modules.jsonl", "a", encoding="utf-8"))
            for m in self._module_lines:
                rf.modules.write(json.dumps(m) + "\n")
            rf.modules.flush()
            self._files[key] = rf
        return rf

    def _sync(self, f: Any) -> None:
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())

    def _write_batch(self, b: Batch) -> None:
        rf = self._rank_files(b.step, b.rank)
        if b.stats is not None and b.stat_slots:
            values = b.stats.cpu().tolist()
            for entry, row in zip(b.stat_slots, values):
                entry.stats = stats_to_dict(row)
        if b.tensors:
            self._write_tensors(rf, b)
        for e in b.tensor_refs:
            e.file = rf.saved_tensors.get(e.key) if e.key is not None else None
            if e.file is None:
                e.key = None
        lines = "".join(_record_line(r.to_json()) for r in b.records)
        rf.records.write(lines)
        self._sync(rf.records)
        rf.n_records += len(b.records)

    def _write_tensors(self, rf: _RankFiles, b: Batch) -> None:
        from safetensors.torch import save_file

        tensors = b.tensors
        if self.max_bytes is not None:
            kept: dict[str, torch.Tensor] = {}
            for k, t in tensors.items():
                n = t.numel() * t.element_size()
                if self._total_tensor_bytes + n > self.max_bytes:
                    if not self.budget_exhausted:
                        log.warning(
                            "dump %s reached its max_bytes budget (%d bytes): tensors are no longer saved; "
                            "records and statistics continue. Raise max_bytes or narrow the filters.",
                            self.root, self.max_bytes)
                    self.budget_exhausted = True
                    rf.dropped_tensors += 1
                    b.tensor_owner[k].file = None
                    b.tensor_owner[k].key = None
                    continue
                self._total_tensor_bytes += n
                kept[k] = t
            tensors = kept
        if not tensors:
            return
        (rf.dir / "tensors").mkdir(exist_ok=True)
        name = f"tensors/{rf.n_tensor_files:06d}.safetensors"
        rf.n_tensor_files += 1
        tmp = rf.dir / (name + ".tmp")
        save_file(tensors, str(tmp))
        if self.fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, rf.dir / name)
        for k, t in tensors.items():
            b.tensor_owner[k].file = name
            rf.saved_tensors[k] = name
            rf.tensor_bytes += t.numel() * t.element_size()

    def _finish_rank(self, rf: _RankFiles, complete: bool) -> None:
        for f in (rf.records, rf.stacks, rf.modules):
            try:
                self._sync(f)
                f.close()
            except OSError:
                pass
        try:
            footer = {"complete": complete and self.error is None, "records": rf.n_records,
                      "tensor_bytes": rf.tensor_bytes, "budget_exhausted": self.budget_exhausted,
                      "dropped_tensors": rf.dropped_tensors}
            if self.error:
                footer["error"] = self.error
            _atomic_write_json(rf.dir / "footer.json", footer)
        except OSError:
            pass

    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if kind == "close":
                    for rf in self._files.values():
                        self._finish_rank(rf, True)
                    self._files.clear()
                    return
                if kind == "barrier":
                    payload.set()
                    continue
                if self.error:
                    continue
                if kind == "batch":
                    try:
                        self._write_batch(payload)
                    finally:
                        if payload.tensors:
                            with self._cond:
                                self._queued_bytes -= payload.nbytes
                                self._cond.notify_all()
                elif kind == "stack":
                    step, rank, sid, frames = payload
                    rf = self._rank_files(step, rank)
                    rf.stacks.write(json.dumps({"id": sid, "frames": frames}) + "\n")
                elif kind == "modules":
                    lines = [{"path": p, "class": c, "parent": par} for p, c, par in payload]
                    self._module_lines.extend(lines)
                    for rf in self._files.values():
                        rf.modules.write("".join(json.dumps(m) + "\n" for m in lines))
                elif kind == "end_step":
                    for key in [k for k in self._files if k[0] == payload]:
                        self._finish_rank(self._files.pop(key), True)
            except OSError as exc:
                self.error = (f"writing the dump to {self.root} failed ({exc.strerror or exc}); nothing after this "
                              f"point was saved. Everything written before is readable. Free disk space or choose "
                              f"another path.")
                log.error(self.error)
                with self._cond:
                    self._cond.notify_all()
            except Exception as exc:  # never kill the user's training from the writer thread
                self.error = f"internal error in the dump writer: {type(exc).__name__}: {exc}"
                log.error(self.error)
                with self._cond:
                    self._cond.notify_all()
