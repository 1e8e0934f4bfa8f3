"""The capture session's pending batch: what was captured since the last flush, and its hand-over
to the writer.

A mixin of :class:`~torchparity.capture.session.CaptureSession`. Committed records wait here
with their entries' statistics (host rows, or rows of the statistics batcher), their saved
tensors and the checksums still to take, until a flush (every ``batch_size`` records, past
64 MiB of host bytes, at the end of each step) hands them to the writer as one
:class:`~.batch.Batch`, their statistics as :class:`StatRows`. The modules seen for the first
time and new call stacks go to the writer too.
"""

from __future__ import annotations

from typing import Any

import torch

from ..records import OpRecord, TensorEntry
from .batch import Batch, RecordSink
from .host_copies import HostCopier, HostCopy
from .module_tracker import ModuleTracker
from .options import DumpOptions
from .stat_batch import RowRef, StatBatcher


class StatRows:
    """The statistics of a batch's entries, in order, for the writer thread: each item is a
    host row (a list of 6 floats, measured at once on the CPU) or a :class:`~.stat_batch.RowRef`
    (a row of the batcher, on the host once its flush's transfer is done). ``tolist()`` gives one
    row per entry (the writer's call; the same as on a stacked host tensor). Keeping host rows as
    lists until then means no dict per value on the training thread."""

    __slots__ = ("refs",)

    def __init__(self, refs: list[Any]) -> None:
        self.refs = refs

    def __len__(self) -> int:
        return len(self.refs)

    def tolist(self) -> list[list[float]]:
        return [r if r.__class__ is list else r.values() for r in self.refs]


class PendingBatch:
    """Mixin of :class:`~torchparity.capture.session.CaptureSession`: the pending lists are set by
    :meth:`_init_pending` and filled by the session's measurements; the statistics batcher, the
    host copier, the ``busy`` flag, the step, the rank, the writer and the tracker are the
    session's attributes."""

    options: DumpOptions
    writer: RecordSink
    tracker: ModuleTracker
    step: int
    _rank: int
    _batcher: StatBatcher
    _copier: HostCopier

    def _init_pending(self) -> None:
        """Start with nothing pending."""
        self._pending: list[OpRecord] = []
        # one per entry of _pending_slots: a host row (list) or a row of the batcher (RowRef)
        self._pending_stats: list[list[float] | RowRef] = []
        self._pending_slots: list[TensorEntry] = []
        self._pending_tensors: dict[str, torch.Tensor] = {}
        self._pending_owner: dict[str, TensorEntry] = {}
        self._pending_refs: list[TensorEntry] = []  # entries pointing at a tensor saved for another entry
        self._pending_bytes = 0
        # md5/tensor modes: (entry, host copy) pairs the writer thread checksums once the copy is done
        self._pending_checksums: list[tuple[TensorEntry, HostCopy]] = []
        self._modules_sent = 0

    def commit(self, rec: OpRecord) -> None:
        self._pending.append(rec)
        if len(self._pending) >= self.options.batch_size or self._pending_bytes > (64 << 20):
            self.flush()

    def flush(self) -> None:
        """Hand the pending records to the writer thread, their statistics reduced by the batcher
        in a constant number of kernels and on their way to the host in one copy per device."""
        if len(self.tracker.known_modules) > self._modules_sent:
            self.writer.add_modules(self.tracker.known_modules[self._modules_sent:])
            self._modules_sent = len(self.tracker.known_modules)
        if not self._pending:
            return
        stats = None
        if self._batcher.queued:
            prev, self.busy = self.busy, True
            try:
                self._batcher.flush()  # a constant number of kernels, one transfer per device group
            finally:
                self.busy = prev
        if self._pending_stats:
            stats = StatRows(self._pending_stats)  # rows read by the writer thread
        batch = Batch(self.step, self._rank, self._pending, self._pending_slots, stats,
                      self._pending_tensors, self._pending_owner, self._pending_bytes, self._pending_refs,
                      self._pending_checksums)
        self._pending_checksums = []
        self._copier.handed()
        self._pending, self._pending_stats, self._pending_slots = [], [], []
        self._pending_tensors, self._pending_owner, self._pending_bytes = {}, {}, 0
        self._pending_refs = []
        self.writer.submit(batch)

    def _on_new_stack(self, sid: int, frames: list[str]) -> None:
        self.writer.add_stack(self.step, self._rank, sid, frames)
