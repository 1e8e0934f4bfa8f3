"""What capture hands to its sink: batches of records, and the sink's interface.

The capture session knows nothing of where records go; the dump's writer
(:class:`torchparity.dump.writer.DumpWriter`) is one :class:`RecordSink`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..records import OpRecord, TensorEntry


@dataclass
class Batch:
    """Records of one step and rank, with their statistics still on the device."""

    step: int
    rank: int
    records: list[OpRecord]
    stat_slots: list[TensorEntry]  # entries whose stats are rows of `stats`, in order
    # one row [max, min, mean, norm, nan, inf] per stat slot: a session.StatRows (host rows and statistics-batcher rows)
    # (its tolist() waits for the flush's one device-to-host copy) or a [n, 6] tensor
    stats: Any
    # key -> CPU tensor, or a capture.host_copies.HostCopy still on its way (the writer waits for it)
    tensors: dict[str, torch.Tensor | Any] = field(default_factory=dict)
    tensor_owner: dict[str, TensorEntry] = field(default_factory=dict)
    nbytes: int = 0
    # entries whose value equals a tensor saved for another entry (this batch or earlier in the
    # step): they get that tensor's file, or no file if it was not saved (max_bytes)
    tensor_refs: list[TensorEntry] = field(default_factory=list)
    # md5 mode: (entry, HostCopy) whose checksum the sink computes once the copy is done
    checksums: list[tuple[TensorEntry, Any]] = field(default_factory=list)
    # records given as pre-encoded lines (a dump.record_json.LineTemplates; ``records`` is then
    # empty): the sink writes them with this batch's step and one statistics row each (``stats``)
    lines: Any = None

    @property
    def n_records(self) -> int:
        """The records this batch carries (as objects, or as pre-encoded lines)."""
        return self.lines.n if self.lines is not None else len(self.records)


class RecordSink(Protocol):
    """Where a :class:`~torchparity.capture.session.CaptureSession` sends what it captured."""

    def submit(self, batch: Batch) -> None:
        """Take a batch (the sink may finish it on another thread)."""

    def end_step(self, step: int) -> None:
        """Step ``step`` is over: no more batches for it."""

    def add_modules(self, modules: list[tuple[str, str, str | None]]) -> None:
        """Modules seen for the first time: (path, class, parent path)."""

    def add_stack(self, step: int, rank: int, sid: int, frames: list[str]) -> None:
        """A call stack first seen in this step, under id ``sid``."""
