"""Columnar summaries of a dump being written, built from the records the writer has in hand.

The dump writer's thread serializes each batch of :class:`~torchparity.records.OpRecord` to
``records.jsonl``; :class:`LiveSummary` keeps, per (step, rank), one tuple per record and per tensor
entry (C-level attribute reads: no parsing, no per-value Python work while training runs) and the
bytes it needs for the fingerprint (the size, the first and the last 64 KiB written). When the
step ends (``summaries="step"``) or the dump closes (``"close"``) the tuples become the reader's
:class:`~.columns.RecordColumns` — with the values as they read back from the JSON the writer wrote
(tuples as lists, NaN scalars as null, ...) — and :func:`.summary_tables.build_tables` makes the
same tables ``torchparity compact`` makes from the file. A unit whose ``records.jsonl`` this writer
did not write whole (it existed before, a write failed) is summarized from the file instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Callable

from ..capture import gc_quiet
from . import columnar
from .columns import STAT_COLUMNS, RecordColumns, _NO_STATS

log = logging.getLogger("torchparity")

#: when the summaries are written: at each step's end, at the dump's close, never (``torchparity compact``)
SUMMARY_WHEN = ("step", "close", "off")

_RECORD = attrgetter("id", "name", "op", "level", "phase", "module", "call_index", "fwd", "stack", "module_class",
                     "step", "rank", "flags")
_ENTRY = attrgetter("io", "arg", "kind", "dtype", "shape", "stride", "device", "requires_grad", "stats", "md5",
                    "file", "key", "producer", "value")
_TENSORS = attrgetter("tensors")
_STATS = itemgetter(*STAT_COLUMNS)
_PLAIN = frozenset({str, int, bool, type(None)})  # values JSON gives back as they are (and finite floats)

try:  # the writer's own encoder: values read back exactly as the file gives them
    from orjson import dumps as _dumps, loads as _loads

    def _as_read(v: Any) -> Any:
        return _loads(_dumps(v))
except ImportError:  # pragma: no cover - orjson is a dependency
    def _as_read(v: Any) -> Any:
        return json.loads(json.dumps(v, allow_nan=False))


def _read_back(v: Any) -> Any:
    """``v`` as ``records.jsonl`` gives it back (tuples as lists, NaN as null, ...)."""
    t = type(v)
    if t in _PLAIN or (t is float and v - v == 0):
        return v
    return _as_read(v)


def _tuples(shapes: list[Any]) -> list[Any]:
    """Shapes (``torch.Size``, tuples, lists) as the reader gives them: tuples, equal ones one object."""
    try:
        distinct = dict.fromkeys(shapes)
    except TypeError:  # a list among them
        shared: dict[Any, Any] = {}
        return [s if s is None else shared.setdefault(tuple(s), tuple(s)) for s in shapes]
    first: dict[Any, Any] = {}
    for s in distinct:
        distinct[s] = None if s is None else first.setdefault(tuple(s), tuple(s))
    return list(map(distinct.__getitem__, shapes))


class LiveSummary:
    """The records of one (step, rank) as the writer wrote them (see the module docstring)."""

    def __init__(self, step: int, rank: int, start_size: int) -> None:
        self.step, self.rank = step, rank
        #: why the file must be read back instead (None: the columns here are the whole file)
        self.why_not: str | None = None if start_size == 0 else "records.jsonl held earlier records"
        self._records: list[tuple[Any, ...]] = []
        self._entries: list[tuple[Any, ...]] = []
        self._counts: list[int] = []
        self._size = 0
        self._head = b""
        self._tail: deque[bytes] = deque()
        self._tail_len = 0

    def add(self, records: list[Any], data: bytes) -> None:
        """``records`` were just appended to ``records.jsonl`` as ``data``."""
        if self.why_not is not None:
            return
        try:
            self._records.extend(map(_RECORD, records))
            lists = list(map(_TENSORS, records))
            self._counts.extend(map(len, lists))
            self._entries.extend(map(_ENTRY, chain.from_iterable(lists)))
        except Exception as exc:  # pragma: no cover - a record object of another shape
            self.why_not = f"a record could not be collected ({type(exc).__name__})"
            return
        fp = columnar.FP_BYTES
        self._size += len(data)
        if len(self._head) < fp:
            self._head += data[:fp - len(self._head)]
        self._tail.append(data)
        self._tail_len += len(data)
        while self._tail_len - len(self._tail[0]) >= fp:
            self._tail_len -= len(self._tail.popleft())

    def fingerprint(self) -> dict[str, Any]:
        """:func:`.columnar.fingerprint` of what was written, without reading the file."""
        tail = b"".join(self._tail)[-columnar.FP_BYTES:]
        return {"size": self._size, "head": hashlib.blake2b(self._head, digest_size=16).hexdigest(),
                "tail": hashlib.blake2b(tail, digest_size=16).hexdigest()}

    def columns(self) -> RecordColumns:
        """The reader's columns of these records (what ``_scan_records`` + ``RecordColumns.add``
        give for the file the writer wrote)."""
        cols = RecordColumns(full=True, step=self.step, rank=self.rank)
        n = len(self._records)
        cols.n_records = n
        cols.lines = [range(1, n + 1)]
        if n:
            (ids, names, ops, levels, phases, modules, cis, fwds, stacks, mcls, steps, ranks,
             flags) = map(list, zip(*self._records))
        else:
            ids, names, ops, levels, phases, modules, cis, fwds, stacks, mcls, steps, ranks, flags = ([] for _ in range(13))
        if None in modules:
            modules = [m if m is not None else "" for m in modules]
        flags = [f if f else None for f in flags]  # to_json writes flags only when there are some
        seen: dict[int, Any] = {}
        for i, f in enumerate(flags):
            if f is not None:
                r = seen.get(id(f))
                if r is None:
                    r = seen[id(f)] = _read_back(f)
                flags[i] = r
        cdt = [f["compute_dtype"] if type(f) is dict and type(f.get("compute_dtype")) is str else None
               for f in flags] if any(flags) else [None] * n
        cols.heads = [ids, names, ops, levels, phases, modules, cis, fwds, stacks, cdt]
        cols.xheads = [mcls, steps, ranks, flags]
        del seen
        m = len(self._entries)
        if m:
            (io, arg, kind, dtype, shape, stride, device, rg, stats, md5, files, keys, prod,
             value) = map(list, zip(*self._entries))
        else:
            io, arg, kind, dtype, shape, stride, device, rg, stats, md5, files, keys, prod, value = ([] for _ in range(14))
        rec = list(chain.from_iterable(map(repeat, range(n), self._counts)))
        other = [j for j, k in enumerate(kind) if k != "tensor"]
        given = 0
        for j in other:  # scalars and None: to_json writes io, arg, kind and value only
            dtype[j] = shape[j] = stride[j] = device[j] = rg[j] = stats[j] = md5[j] = files[j] = None
            prod[j] = None
            v = value[j]
            if v is not None:
                value[j] = _read_back(v)
                given += 1
        if m - value.count(None) > given:  # tensors: no value in the JSON
            for j, v in enumerate(value):
                if v is not None and kind[j] == "tensor":
                    value[j] = None
        shape, stride = _tuples(shape), _tuples(stride)
        # statistics: a tuple per entry (non-finite values stay floats: the same float64 columns)
        stats_t: list[Any] = []
        put = stats_t.append
        problems: list[tuple[int, int, str]] = []  # (entry, order of the reader's checks, what)
        for j, st in enumerate(stats):
            if st is None:
                put(_NO_STATS)
                continue
            try:
                put(_STATS(st))
            except KeyError:  # a statistic missing: the entry is damaged (as the reader says)
                put(tuple(map(st.get, STAT_COLUMNS)))
                problems.append((j, 2, ".stats lacks " + ", ".join(c for c in STAT_COLUMNS if c not in st)))
        for j, (k, d, s) in enumerate(zip(kind, dtype, shape)):  # the reader's structural checks
            if k == "tensor" and d is None:
                problems.append((j, 0, " is a tensor without dtype"))
            if k == "tensor" and s is None:
                problems.append((j, 1, " is a tensor without shape"))
        for j, _order, what in sorted(problems):
            cols.bad.setdefault(rec[j], f"tensors[{j - rec.index(rec[j])}]{what}")
        if keys.count(None) != m:
            keys = [k if f is not None else None for f, k in zip(files, keys)]
        if tuple in set(map(type, prod)):
            prod = [list(p) if type(p) is tuple else p for p in prod]
        cols.cols = [rec, io, arg, kind, dtype, shape, stride, rg, stats_t, md5, value, prod, files, keys]
        cols.device = device
        return cols

    def tables(self, tree: dict[Any, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The three summary tables and their metadata (:func:`.summary_tables.build_tables`)."""
        return columnar.build_tables(self.columns(), len(self._records), [], self.fingerprint(), self.step,
                                     self.rank, tree)


class SummarySink:
    """The writer's side of the summaries: when to write them (``summaries``) and what each
    rank directory's ``footer.json`` says about them. Never raises into the writer thread.

    Summaries are never fsynced, whatever the dump's ``fsync``: they are a cache of
    ``records.jsonl`` (which is), each file checked against its digest when read. One torn by a
    power loss reads as stale, the compare reads the JSONL instead and ``torchparity compact``
    rewrites it; fsyncing them cost the writer thread six fsyncs per (step, rank)."""

    def __init__(self, when: str, write_json: Callable[[Path, dict[str, Any]], None]) -> None:
        self.when = when
        self._write_json = write_json
        self._pending: list[tuple[Path, int, int, Path, LiveSummary | None, dict[str, Any], dict[str, Any]]] = []

    def start(self, step: int, rank: int, start_size: int) -> LiveSummary | None:
        """A collector for a (step, rank) whose ``records.jsonl`` is ``start_size`` bytes now."""
        if self.when == "off" or columnar.missing_pyarrow():
            return None
        return LiveSummary(step, rank, start_size)

    def finish(self, root: Path, step: int, rank: int, rank_dir: Path, live: LiveSummary | None,
               module_lines: list[dict[str, Any]], whole: bool, footer: dict[str, Any]) -> None:
        """The (step, rank) was closed: write its summaries now (``step``) or keep them for the
        close (``close``), and put what happened in ``footer`` (the caller writes it).

        :param whole: the writer wrote every record and module line it was given (no error)."""
        if self.when == "off":
            footer.update(summary=False, summary_error="summaries='off': not written while training "
                                                       "(torchparity query or torchparity compact DIR writes them)")
            return
        if live is not None and not whole:
            live.why_not = live.why_not or "a write failed"
        tree = columnar.module_tree(module_lines)
        if self.when == "close":
            footer.update(summary=False, summary_error="summaries='close': written when the dump closes")
            self._pending.append((root, step, rank, rank_dir, live, tree, footer))
            return
        footer.update(self._write(root, step, rank, rank_dir, live, tree))

    def close(self) -> None:
        """``summaries="close"``: write every kept unit's summaries and update its footer."""
        pending, self._pending = self._pending, []
        for root, step, rank, rank_dir, live, tree, footer in pending:
            footer.pop("summary_error", None)
            footer.update(self._write(root, step, rank, rank_dir, live, tree))
            try:
                self._write_json(rank_dir / "footer.json", footer)
            except OSError:
                pass

    def _write(self, root: Path, step: int, rank: int, rank_dir: Path, live: LiveSummary | None,
               tree: dict[Any, Any]) -> dict[str, Any]:
        if live is not None and live.why_not is None:
            try:
                with gc_quiet.paused():  # bulk allocation: the collector would only walk it
                    why = columnar.write_tables(root, step, rank, lambda: live.tables(tree))
                return {"summary": True} if why is None else {"summary": False, "summary_error": why}
            except Exception as exc:  # pragma: no cover - a value of an odd type: the file says it all
                log.debug("torchparity: summary of step %d rank %d from the file (%r)", step, rank, exc)
        # summarize the file, as torchparity compact does
        return columnar.footer_fields(root, step, rank, rank_dir, False)
