"""The dump of records captured in compiled graphs, written by the dump's own writer.

The records become :class:`~torchparity.records.OpRecord`/``TensorEntry`` objects and go to a
:class:`~torchparity.dump.writer.DumpWriter` like an eager dump's: the same layout
(docs/dump-format.md), rank lock, crash safety, footers and Parquet summaries. Each step's
``header.json`` carries ``compile``: the graphs instrumented and what was not captured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ..capture.batch import Batch
from ..capture.ranks import current_rank, world_size
from ..records import FORMAT_NAME, FORMAT_VERSION, op_record, tensor_entry
from .records import NodeRecord


#: sequences of graph runs whose pre-encoded lines are kept (steps that alternate between a few)
_TEMPLATES_KEPT = 4


class CompiledDump:
    """Step by step, the records of one :class:`~torchparity.compile.backend.CompileCapture`.
    The writer starts with the first step written (nothing is created before)."""

    def __init__(self, root: Path, compile_header: Callable[[], dict[str, Any]], summaries: str = "off") -> None:
        self.root = root
        self.summaries = summaries
        self.compile_header = compile_header
        self._writer: Any = None
        self._rank = 0
        #: ids of a step's graph runs' record lists -> (those lists, LineTemplates or None, stacks)
        self._tpl: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def _open(self) -> Any:
        from .. import __version__
        from ..dump.device_env import describe_device
        from ..dump.writer import DumpWriter

        self._rank = current_rank()
        header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "tool_version": __version__, "level": "aten",
                  "mode": "statistics", "checksum": None, "world_size": world_size(),
                  "torch_version": torch.__version__,
                  "backend": describe_device(None)}  # the device, as an eager dump's header says it
        self._writer = DumpWriter(self.root, header, rank=self._rank,
                                  step_header=lambda step: {"compile": self.compile_header()},
                                  summaries=self.summaries)
        return self._writer

    def write_step(self, step: int, captured: list[NodeRecord], stats: Any, key: tuple[Any, ...] | None = None) -> int:
        """Write one step's records (``captured``, in execution order; ``stats``: their statistics,
        one row of six per record: a float64 host tensor, or a ``StatRows`` of batcher rows the
        writer thread reads once their transfer is done). Returns the number of records written.

        ``key``: what identifies ``captured`` from step to step (the graph runs' record lists, in
        order; None when this step's records may differ from the last's, e.g. symbolic shapes).
        A step whose key is one of the last few steps' (a training step and an evaluation step
        alternating: :data:`_TEMPLATES_KEPT`) repeats its records but for the step and the
        statistics: the writer then gets pre-encoded lines (:class:`~..dump.record_json.LineTemplates`)
        instead of record objects, built once per key. Not with Parquet summaries written while
        training (``summaries`` step or close), which collect record objects."""
        writer = self._writer or self._open()
        rank = self._rank
        if key is not None and self.summaries == "off":
            ids = tuple(map(id, key))  # unique while the cache holds the lists themselves
            hit = self._tpl.get(ids)
            if hit is None:
                if len(self._tpl) >= _TEMPLATES_KEPT:  # the oldest sequence goes
                    del self._tpl[next(iter(self._tpl))]
                hit = self._tpl[ids] = (key, *self._templates(step, captured, rank))
            lines, stacks = hit[1], hit[2]
            if lines is not None:
                if stacks:
                    writer.add_stacks(step, rank, stacks)
                writer.submit(Batch(step, rank, [], [], stats, lines=lines))
                writer.end_step(step)
                return lines.n
        records, slots, stacks = self._records(step, captured, rank)
        if stacks:
            writer.add_stacks(step, rank, stacks)
        writer.submit(Batch(step, rank, records, slots, stats))
        # no flush: the writer thread writes the step while training goes on (waiting for it here
        # cost ~16 ms of a 16 ms step); close() writes what is queued
        writer.end_step(step)
        return len(records)

    def _templates(self, step: int, captured: list[NodeRecord], rank: int) -> tuple[Any, list[tuple[int, list[str]]]]:
        """(LineTemplates of these records, or None where they do not fit; their call stacks)."""
        from ..dump.record_json import LineTemplates

        records, _, stacks = self._records(step, captured, rank)
        try:
            return LineTemplates(records), stacks
        except ValueError:
            return None, stacks

    @staticmethod
    def _records(step: int, captured: list[NodeRecord], rank: int) -> tuple[list[Any], list[Any], list[tuple[int, list[str]]]]:
        """The step's record objects, their entries awaiting statistics, and the call stacks
        ``(id, [source line])`` they name."""
        names: dict[str, int] = {}
        calls: dict[tuple[str, str, str], int] = {}
        stack_ids: dict[str, int] = {}
        stacks: list[tuple[int, list[str]]] = []
        records, slots = [], []
        for rid, rec in enumerate(captured):
            short = rec.op.split(".")[1] if rec.op.startswith(("aten.", "prims.")) else rec.op.split(".")[0]
            n = names.get(short, 0)
            names[short] = n + 1
            key = (rec.phase, rec.module, rec.op)
            ci = calls.get(key, 0)
            calls[key] = ci + 1
            stack = None
            if rec.source:
                stack = stack_ids.get(rec.source)
                if stack is None:
                    stack = stack_ids[rec.source] = len(stack_ids)
                    stacks.append((stack, [rec.source]))
            r = op_record(rid, f"Aten.{short}.{n}.{rec.phase}", rec.op, "aten", rec.phase, rec.module, ci, step,
                          rank, rec.module_class, None, stack,
                          {"compiled": True, "node": rec.node, "node_id": rec.node_id, **rec.extra})
            e = tensor_entry("output", "0", rec.dtype, rec.shape, rec.stride, rec.device, False)
            r.tensors = [e]
            records.append(r)
            slots.append(e)
        return records, slots, stacks

    def close(self) -> None:
        """Write what is queued and close the dump."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._tpl = {}  # their lines spell this rank
