"""The dump writer: append-only JSON Lines and safetensors batches, written off the training thread.

The training thread hands over complete batches (records plus a stacked tensor of their
statistics, plus CPU copies of tensors in tensor mode). A single worker thread brings the
statistics to the host in one transfer, writes tensor files atomically (temp name, then rename),
then appends the records that reference them and flushes. A process killed at any moment leaves
everything up to the last complete batch readable.

Errors (disk full, file size limit, permissions) never stop the user's training, and each kind is
told once, in one line:

* a tensor file that cannot be written is removed and its tensors are dropped (their entries keep
  their statistics and lose the file reference); tensors are no longer saved from then on, records
  and statistics continue;
* a record line that cannot be written is cut back (``records.jsonl`` always ends with a complete
  line), and nothing more is written; everything written before stays readable.

``footer.json`` then carries ``"complete": false``, ``"error"`` (that one line),
``"records"`` (lines written), ``"dropped_records"`` and ``"dropped_tensors"``. When the user's
code raised inside ``with torchparity.dump(...)`` (a dead peer rank, an OOM, Ctrl-C) the step it
stopped in gets ``"complete": false`` and ``"interrupted"`` (the exception, one line). One process
per (directory, rank) may write: see :mod:`torchparity.dump.lock`.
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
from typing import Any, Callable

import torch

from ..records import FORMAT_NAME, FORMAT_VERSION, OpRecord, TensorEntry
from ..capture.batch import Batch  # noqa: F401 (re-exported: the record batch lives with capture)
from ..capture.host_copies import host_tensor, release_copies
from . import columnar as _columnar
from .record_json import encode_lines, stats_dict
from .summary_live import LiveSummary, SummarySink

log = logging.getLogger("torchparity")

try:  # orjson encodes records ~5x faster than json.dumps; the writer thread then holds the GIL less
    from orjson import dumps as _orjson_dumps

    def _record_line(d: dict[str, Any]) -> str:
        return _orjson_dumps(d).decode() + "\n"
except ImportError:  # pragma: no cover - orjson is a dependency; stay usable without it
    def _record_line(d: dict[str, Any]) -> str:
        return json.dumps(d, allow_nan=False) + "\n"


@dataclass
class _RankFiles:
    step: int
    rank: int
    dir: Path
    records: Any  # binary, unbuffered append-only files: see _append
    stacks: Any
    modules: Any
    n_records: int = 0
    dropped_records: int = 0
    n_tensor_files: int = 0
    tensor_bytes: int = 0
    dropped_tensors: int = 0
    saved_tensors: dict[str, str] = field(default_factory=dict)  # tensor key -> its file
    summary: LiveSummary | None = None  # the columnar summary's columns, collected as records are written


def _append(f: Any, data: bytes) -> None:
    """Append ``data`` to the unbuffered binary file ``f`` entirely, or not at all: on a failed
    or short write (disk full, file size limit) the file is cut back to where it was, so it always
    ends with a complete line, and the OSError is raised."""
    fd = f.fileno()
    start = os.fstat(fd).st_size
    view, done = memoryview(data), 0
    try:
        while done < len(view):
            n = os.write(fd, view[done:])
            if n <= 0:  # pragma: no cover - a regular file never returns 0 for a non-empty write
                raise OSError(28, "No space left on device")
            done += n
    except OSError:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise


def _reason(exc: BaseException) -> str:
    """A short one-line reason for a failed write ("File too large", "No space left on device")."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    m = re.search(r"os error (\d+)", str(text))  # safetensors wraps the OS error in its own
    if m and not isinstance(exc, OSError):
        return os.strerror(int(m.group(1)))
    return " ".join(str(text).split())


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    # a name of its own per process and thread: the ranks of a job write the same torchparity.json
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)


_OPENED_IN_THIS_PROCESS: set[tuple[str, int]] = set()


def _make_dir(d: Path, tries: int = 5) -> None:
    """``d`` and its parents. Another rank cleaning its earlier run out of the same dump may
    remove the step directory between this rank's making it and making ``d`` inside it
    (:func:`replace_previous_run`): then it is made again."""
    for attempt in range(tries):
        try:
            d.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == tries - 1:
                raise


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
    _columnar.remove_rank_summaries(root, rank)  # this rank's Parquet summaries go with its data
    for step_dir in root.iterdir():
        if not (step_dir.is_dir() and re.fullmatch(r"step\d+", step_dir.name)):
            continue
        rank_dir = step_dir / f"rank{rank}"
        if not rank_dir.is_dir():
            # (never rmdir a step directory this rank held nothing in: another rank of this run may
            # have just made it, about to make its own rank directory inside: a CI run lost rank
            # 1's step 0 that way, both ranks starting at once)
            continue
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
                 max_bytes: int | None = None, max_queue_bytes: int = 1 << 30, rank: int | None = None,
                 step_header: Callable[[int], dict[str, Any]] | None = None, summaries: str = "off") -> None:
        self.root = Path(root)
        self.header = header
        self.step_header = step_header  # step -> what that step's header.json adds or overrides
        self.fsync = fsync
        self.max_bytes = max_bytes
        self.max_queue_bytes = max_queue_bytes
        self.error: str | None = None  # records could not be written: the dump stopped there
        self.tensor_error: str | None = None  # tensors could not be written: no more tensors saved
        self.interrupted: str | None = None  # set by the dumper when the user's code raised: the open steps stopped early
        self.budget_exhausted = False
        self._file_mode = 0o644
        self._lock: Any = None
        self._closing = False
        self._dropped_late: dict[tuple[int, int], int] = {}  # records refused after self.error
        self._files: dict[tuple[int, int], _RankFiles] = {}
        self._opened: dict[int, set[int]] = {}  # rank -> the steps whose directory this writer opened
        self._queue: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._total_tensor_bytes = 0
        self._module_lines: list[dict[str, Any]] = []
        # columnar summaries (dump/summary_live.py): when they are written, and their columns per (step, rank)
        self._summaries = SummarySink(summaries, _atomic_write_json)
        if summaries != "off":
            _columnar.preload()  # never first imported at interpreter exit (see preload)
        self._thread = threading.Thread(target=self._run, name="torchparity-writer", daemon=True)
        from ..errors import UsageError
        from .lock import DumpLock

        try:
            if self.root.exists() and not self.root.is_dir():
                raise UsageError(f"dump path {self.root} is a file, not a directory; choose a directory path")
            self.root.mkdir(parents=True, exist_ok=True)
            if rank is not None:  # before anything is replaced: a second writer must not wipe the first's data
                self._lock = DumpLock(self.root, rank).acquire()
            try:
                if rank is not None:
                    replace_previous_run(self.root, rank)
                _atomic_write_json(self.root / "torchparity.json", {
                    "format": FORMAT_NAME, "version": FORMAT_VERSION, "tool_version": header.get("tool_version"),
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                })
                # tensor files get the mode the rest of the dump gets (the user's umask)
                self._file_mode = (self.root / "torchparity.json").stat().st_mode & 0o777
            except BaseException:
                if self._lock is not None:
                    self._lock.release()
                raise
        except OSError as exc:
            raise UsageError(f"cannot write the dump to {self.root}: {_reason(exc)}; choose a writable directory "
                             f"(option path / -o)") from None
        self._thread.start()

    # ---- producer side (training thread) --------------------------------------------------
    def submit(self, batch: Batch) -> None:
        if self.error:  # stopped: only the count travels, for the footer
            self._queue.put(("dropped", (batch.step, batch.rank, batch.n_records)))
            return
        if batch.tensors:
            with self._cond:
                while self._queued_bytes + batch.nbytes > self.max_queue_bytes and self._queued_bytes > 0 and not self.error:
                    self._cond.wait(timeout=1.0)  # back-pressure: bounded host memory
                self._queued_bytes += batch.nbytes
        self._queue.put(("batch", batch))

    def add_stack(self, step: int, rank: int, sid: int, frames: list[str]) -> None:
        self._queue.put(("stack", (step, rank, sid, frames)))

    def add_stacks(self, step: int, rank: int, stacks: list[tuple[int, list[str]]]) -> None:
        """Several call stacks of one step at once: ``(sid, frames)`` each (one queue message)."""
        self._queue.put(("stacks", (step, rank, stacks)))

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
        if self._thread.is_alive():
            self._queue.put(("close", None))
            self._thread.join()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ---- worker side -------------------------------------------------------------------------
    def _rank_files(self, step: int, rank: int) -> _RankFiles:
        key = (step, rank)
        rf = self._files.get(key)
        if rf is None:
            d = self.root / f"step{step}" / f"rank{rank}"
            _make_dir(d)
            # the step this rank wrote before this one: a reader tells a step directory that was
            # lost (deleted, never copied) from one that was never dumped
            opened = self._opened.setdefault(rank, set())
            before = [s for s in opened if s < step]
            opened.add(step)
            header = dict(self.header, **(self.step_header(step) if self.step_header else {}), step=step, rank=rank,
                          prev_step=max(before) if before else None,
                          created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          pid=os.getpid(), hostname=socket.gethostname())
            _atomic_write_json(d / "header.json", header)
            rf = _RankFiles(step, rank, d, open(d / "records.jsonl", "ab", buffering=0),
                            open(d / "stacks.jsonl", "ab", buffering=0),
                            open(d / "modules.jsonl", "ab", buffering=0))
            rf.summary = self._summaries.start(step, rank, os.fstat(rf.records.fileno()).st_size)
            self._files[key] = rf
            if self._module_lines:
                _append(rf.modules, "".join(json.dumps(m) + "\n" for m in self._module_lines).encode())
        return rf

    def _sync(self, f: Any) -> None:
        if self.fsync:
            os.fsync(f.fileno())

    def _write_batch(self, b: Batch) -> None:
        rf = self._rank_files(b.step, b.rank)
        if b.lines is not None:  # pre-encoded records (a compiled graph's): the step and statistics filled in
            rows = b.stats.tolist() if not isinstance(b.stats, torch.Tensor) else b.stats.cpu().tolist()
            self._append_records(rf, b, b.lines.encode(b.step, rows), b.lines.n)
            if rf.summary is not None:  # no record objects to collect: summarized from the file
                rf.summary.why_not = rf.summary.why_not or "records written as pre-encoded lines"
            return
        ready: set[int] = set()  # ids of the statistics dicts that encode as they are (record_json)
        if b.stats is not None and b.stat_slots:
            # a StatRows waits here (the writer thread) for its flush's device-to-host copy
            values = b.stats.tolist() if not isinstance(b.stats, torch.Tensor) else b.stats.cpu().tolist()
            # stats_to_dict(); finite ones written as they are. A row measured once and reused (an
            # op's output read by later ops) is the same list object: its entries share one dict
            made: dict[int, dict[str, Any]] = {}
            for entry, row in zip(b.stat_slots, values):
                if row is None:
                    entry.stats = None
                    continue
                st = made.get(id(row))
                if st is None:
                    st = made[id(row)] = stats_dict(row, ready)
                entry.stats = st
        for entry, copy in b.checksums:  # md5 mode: wait for each asynchronous host copy, hash it
            entry.md5 = copy.checksum()
        if b.tensors:
            self._write_tensors(rf, b)
        for e in b.tensor_refs:
            e.file = rf.saved_tensors.get(e.key) if e.key is not None else None
            if e.file is None:
                e.key = None
        data = encode_lines(b.records, ready)  # "".join(_record_line(r.to_json()) ...), less work
        if self._append_records(rf, b, data, len(b.records)) and rf.summary is not None:
            rf.summary.add(b.records, data)

    def _append_records(self, rf: _RankFiles, b: Batch, data: bytes, n: int) -> bool:
        """Append ``n`` encoded records to the rank's records.jsonl; False (and the dump stopped,
        with one message) when the disk refused them."""
        try:
            _append(rf.records, data)
        except OSError as exc:
            rf.dropped_records += n
            self._fail(f"writing the dump to {self.root} failed at step {b.step} ({_reason(exc)}): the "
                       f"{rf.n_records} records written before are kept and readable, nothing after is "
                       f"saved; training goes on. Free disk space or choose another path.")
            return False
        self._sync(rf.records)
        rf.n_records += n
        return True

    def _drop_tensors(self, rf: _RankFiles, b: Batch, keys: Any) -> None:
        for k in keys:
            rf.dropped_tensors += 1
            b.tensor_owner[k].file = None
            b.tensor_owner[k].key = None

    def _write_tensors(self, rf: _RankFiles, b: Batch) -> None:
        from safetensors.torch import save_file

        tensors = b.tensors
        if self.tensor_error:  # the disk refused a tensor file before: statistics only from here on
            self._drop_tensors(rf, b, list(tensors))
            return
        tensors = {k: host_tensor(t) for k, t in tensors.items()}  # waits for asynchronous host copies
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
        try:
            save_file(tensors, str(tmp))
            os.chmod(tmp, self._file_mode)  # safetensors creates 0600; the rest of the dump follows the umask
            if self.fsync:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
            os.replace(tmp, rf.dir / name)
        except Exception as exc:  # OSError, or safetensors' own error wrapping one (disk full, size limit)
            try:
                tmp.unlink()
            except OSError:
                pass
            self._drop_tensors(rf, b, list(tensors))
            self.tensor_error = (f"saving tensors in {rf.dir} failed at step {b.step} ({_reason(exc)}): tensors are "
                                 f"no longer saved, records and statistics go on; free disk space, or lower "
                                 f"max_bytes / narrow the filters")
            self._tell(self.tensor_error)
            return
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
            dropped = rf.dropped_records + self._dropped_late.pop((rf.step, rf.rank), 0)
            error = self.error or (self.tensor_error if rf.dropped_tensors else None)
            stopped = self.interrupted if self._closing else None  # the user's code raised in this step
            footer = {"complete": complete and error is None and dropped == 0 and not stopped, "records": rf.n_records,
                      "dropped_records": dropped, "tensor_bytes": rf.tensor_bytes,
                      "budget_exhausted": self.budget_exhausted, "dropped_tensors": rf.dropped_tensors}
            # columnar summaries (dump/summary_live.py): Parquet of this step/rank's records, off the training thread
            self._summaries.finish(self.root, rf.step, rf.rank, rf.dir, rf.summary, self._module_lines,
                                   self.error is None and dropped == 0, footer)
            rf.summary = None
            if error:
                footer["error"] = error
            if stopped:
                footer["interrupted"] = stopped
            _atomic_write_json(rf.dir / "footer.json", footer)
        except OSError:
            pass

    def _tell(self, message: str) -> None:
        """Tell the user once, in one line (the writer thread's only way to reach them)."""
        log.error("torchparity: %s", message)

    def _fail(self, message: str) -> None:
        """Stop writing for good after a failed record write; keep what is on disk."""
        if self.error is None:
            self.error = message
            self._tell(message)
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if kind == "close":
                    self._closing = True
                    for rf in self._files.values():
                        self._finish_rank(rf, True)
                    self._files.clear()
                    self._summaries.close()  # summaries="close": every step's, now
                    return
                if kind == "barrier":
                    payload.set()
                    continue
                if kind == "batch":
                    try:
                        if self.error:  # stopped: count what is not written, for the footer
                            key = (payload.step, payload.rank)
                            self._dropped_late[key] = self._dropped_late.get(key, 0) + payload.n_records
                        else:
                            self._write_batch(payload)
                    finally:
                        release_copies(payload.tensors, payload.checksums)  # host buffers back to the pool
                        if payload.tensors:
                            with self._cond:
                                self._queued_bytes -= payload.nbytes
                                self._cond.notify_all()
                elif kind == "end_step":  # also after an error: the footer says what happened
                    for key in [k for k in self._files if k[0] == payload]:
                        self._finish_rank(self._files.pop(key), True)
                elif kind == "dropped":
                    step, rank, n = payload
                    self._dropped_late[(step, rank)] = self._dropped_late.get((step, rank), 0) + n
                elif self.error:
                    continue
                elif kind == "stack":
                    step, rank, sid, frames = payload
                    rf = self._rank_files(step, rank)
                    _append(rf.stacks, (json.dumps({"id": sid, "frames": frames}) + "\n").encode())
                elif kind == "stacks":
                    step, rank, stacks = payload
                    rf = self._rank_files(step, rank)
                    _append(rf.stacks, "".join(json.dumps({"id": sid, "frames": frames}) + "\n"
                                               for sid, frames in stacks).encode())
                elif kind == "modules":
                    lines = [{"path": p, "class": c, "parent": par} for p, c, par in payload]
                    self._module_lines.extend(lines)
                    for rf in self._files.values():
                        _append(rf.modules, "".join(json.dumps(m) + "\n" for m in lines).encode())
            except OSError as exc:
                self._fail(f"writing the dump to {self.root} failed ({_reason(exc)}): nothing after this point "
                           f"is saved, everything written before is readable; training goes on. Free disk space "
                           f"or choose another path.")
            except Exception as exc:  # never kill the user's training from the writer thread
                self._fail(f"internal error in the dump writer: {type(exc).__name__}: {' '.join(str(exc).split())}")
