"""A reference point for bench_launch: the least a Python aten-level statistics capture can do.

:class:`LeanFloor` is a consumer of torchparity's op stream (the same dispatch mode and module
tracking the dump uses) that keeps only what a useful record needs: the op's name, phase and
module path; per tensor argument its dtype, shape and stride; statistics (``host_stats``) of every
floating tensor, measured once per value (reused while the tensor's version counter is
unchanged); JSON lines (orjson) written by a thread. It has none of the dump's other work:
producer links, uninitialised-memory and write tracking, scalar arguments, flags, optimizer
parameter names, backward module tags, stacks, per-step files, crash-safety (fsync), summaries.
Its records are not a dump; it exists to show how much of the dump's cost a leaner Python design
could remove, and what no Python design can (bench/results/session15/).
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from typing import Any, Callable

import orjson
import torch

from torchparity.capture.flatten import flat_args, flat_outputs
from torchparity.capture.op_stream import LAYER_OBSERVER, OpCall, OpConsumer, op_stream
from torchparity.capture.stats import host_stats

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class LeanFloor(OpConsumer):
    """``with LeanFloor(model, directory):`` records every counted aten op into
    ``directory/lean.jsonl``."""

    layer = LAYER_OBSERVER
    needs_modules = True

    def __init__(self, model: torch.nn.Module, directory: str) -> None:
        self.model = model
        self.path = os.path.join(directory, "lean.jsonl")
        self.records = 0
        self.per_step: list[int] = []  # records of each ended step
        self._at_step_start = 0
        self._batch: list[tuple] = []
        self._memo: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, stats)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy = False

    def __enter__(self) -> "LeanFloor":
        self._file = open(self.path, "wb")
        self._thread = threading.Thread(target=self._write, name="lean-floor-writer", daemon=True)
        self._thread.start()
        op_stream().attach(self, model=self.model)
        return self

    def __exit__(self, *exc: Any) -> None:
        op_stream().detach(self)
        if self._batch:
            self._queue.put(self._batch)
            self._batch = []
        self._queue.put(None)
        assert self._thread is not None
        self._thread.join()
        self._file.close()

    def on_step_end(self, step: int) -> None:
        self.per_step.append(self.records - self._at_step_start)
        self._at_step_start = self.records

    def _write(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            self._file.write(b"".join(orjson.dumps(
                {"id": r[0], "name": r[1], "phase": r[2], "module": r[3],
                 "tensors": [{"io": io, "arg": arg, "dtype": str(dt), "shape": list(shape), "stride": list(stride),
                              "stats": st} for io, arg, dt, shape, stride, st in r[4]]},
                option=orjson.OPT_APPEND_NEWLINE) for r in batch))

    def _entries(self, pairs: Any, io: str, out: list) -> None:
        memo = self._memo
        for arg, v in pairs:
            if v.__class__ in _PLAIN:
                m = memo.get(id(v))
                if m is not None and m[0]() is v and m[1] == v._version:
                    st = m[2]
                else:
                    st = host_stats(v) if v.is_floating_point() else None
                    memo[id(v)] = (weakref.ref(v), v._version, st)
                out.append((io, arg, v.dtype, v.shape, v.stride(), st))

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        if self._busy or not call.info.counted:
            return run(*args, **kwargs)
        tracker = op_stream().tracker
        frame = tracker.current() if tracker is not None else None
        entries: list[tuple] = []
        self._busy = True
        try:
            self._entries(flat_args(args, kwargs), "input", entries)
        finally:
            self._busy = False
        out = run(*args, **kwargs)
        self._busy = True
        try:
            self._entries(flat_outputs(out), "output", entries)
        finally:
            self._busy = False
        self.records += 1
        self._batch.append((self.records, call.name, call.phase, frame.path if frame is not None else "", entries))
        if len(self._batch) >= 256:
            self._queue.put(self._batch)
            self._batch = []
            if len(self._memo) > 20_000:
                self._memo.clear()
        return out
