"""Host copies of what a replay needs: a snapshot of parameters, optimizer state and grad scaler
every K steps, and each later step's batch and RNG states (CPU, CUDA, Python, NumPy)."""

from __future__ import annotations

import copy
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture.tool_state import tool_work
from ..errors import UsageError


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` (pinned and asynchronous from a CUDA device)."""
    t = t.detach()
    if t.device.type == "cuda":
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        return h
    return t.clone()


def _into_host(t: torch.Tensor, old: Any) -> torch.Tensor:
    """A host copy of ``t``, written into ``old`` (a host tensor of the previous snapshot) when it
    has the same shape, stride and dtype: no new allocation (no page faults, no new pinned block)."""
    if (isinstance(old, torch.Tensor) and old.device.type == "cpu" and old.dtype == t.dtype
            and old.shape == t.shape and old.stride() == t.stride()):
        old.copy_(t.detach(), non_blocking=t.device.type == "cuda" and old.is_pinned())
        return old
    return _to_host(t)


def _walk(x: Any, old: Any, fn: Any) -> Any:
    """``x`` with each tensor ``t`` replaced by ``fn(t, o)``, ``o`` being what stands at the same
    place in ``old`` (the same structure from the last snapshot; None where there is none)."""
    if isinstance(x, torch.Tensor):
        return fn(x, old)
    if isinstance(x, dict):
        prev = old if isinstance(old, dict) else {}
        items = ((k, _walk(v, prev.get(k), fn)) for k, v in x.items())
        return {k: v for k, v in items} if type(x) is dict else type(x)(items)
    if isinstance(x, (list, tuple)):
        prev = list(old) if isinstance(old, (list, tuple)) and len(old) == len(x) else [None] * len(x)
        out = [_walk(v, o, fn) for v, o in zip(x, prev)]
        return type(x)(*out) if hasattr(x, "_fields") else type(x)(out)
    return x


def _tree(x: Any, fn: Any) -> Any:
    """``x`` with each tensor ``t`` replaced by ``fn(t)`` (dicts, lists, tuples, named tuples)."""
    return _walk(x, None, lambda t, _old: fn(t))


def tree_bytes(x: Any) -> int:
    """Bytes of the tensors in a nested structure."""
    n = [0]

    def add(t: torch.Tensor) -> torch.Tensor:
        n[0] += t.numel() * t.element_size()
        return t

    _tree(x, add)
    return n[0]


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from."""
    st: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        st["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["cpu"])
    random.setstate(st["python"])
    if "cuda" in st:
        torch.cuda.set_rng_state_all(st["cuda"])
    if "numpy" in st:
        import numpy as np

        np.random.set_state(st["numpy"])


@dataclass
class StepRecord:
    """One step since the snapshot: its batch (on the host), where its tensors lived, RNG states
    before it ran and what the cheap tier read (loss, grad norm)."""

    step: int
    batch: Any
    devices: Any
    rng: dict[str, Any]
    loss: float | None = None
    norm: float | None = None

    def device_batch(self) -> Any:
        with tool_work():
            return _tree_zip(self.batch, self.devices)


def _tree_zip(batch: Any, devices: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(devices) if devices is not None and batch.device != devices else batch.clone()
    if isinstance(batch, dict):
        return {k: _tree_zip(v, devices[k]) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        out = [_tree_zip(b, d) for b, d in zip(batch, devices)]
        return type(batch)(*out) if hasattr(batch, "_fields") else type(batch)(out)
    return copy.deepcopy(batch)


def _devices(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.device
    if isinstance(x, dict):
        return {k: _devices(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_devices(v) for v in x]
    return None


@dataclass
class State:
    """Parameters and buffers, optimizer state and grad-scaler state on the host."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any] | None
    rng: dict[str, Any] = field(default_factory=dict)
    copied: Any = None  # a CUDA event after the device-to-host copies (None: nothing in flight)

    @property
    def nbytes(self) -> int:
        return tree_bytes(self.model) + tree_bytes(self.optimizer)

    def ready(self) -> None:
        """Wait until the host copies are written (before the CPU reads them)."""
        if self.copied is not None:
            self.copied.synchronize()


class SnapshotJob:
    """A snapshot being taken. Buffers (BatchNorm's running statistics: the forward writes them),
    the grad scaler and the RNG states are copied at once; the parameters and the optimizer state,
    most of the bytes, on a background thread while the step's forward and backward run (they do
    not write them). :meth:`result` waits for it: it must be called before the optimizer step
    changes them (the watch calls it from an optimizer step pre-hook). ``background=False`` copies
    everything before returning."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, scaler: Any, reuse: State | None = None,
                 background: bool = True) -> None:
        t0 = time.perf_counter()
        #: seconds this snapshot costs the run, as estimated: its part on the training thread plus
        #: the background copy's wall time (on the CPU the copy takes the memory bandwidth and cores
        #: training uses for that long; its thread's own CPU time misses the intra-op threads doing
        #: the copies; from a GPU the copies are asynchronous and the thread's time is short)
        self.cost = 0.0
        self._copy_wall = 0.0
        with tool_work(), torch.no_grad():
            sd = model.state_dict(keep_vars=True)
            param_ids = {id(p) for p in model.parameters()}
            old_m = reuse.model if reuse is not None else {}
            self._keys = list(sd)
            self._buffers = {k: _into_host(v, old_m.get(k)) for k, v in sd.items() if id(v) not in param_ids}
            params = {k: v for k, v in sd.items() if id(v) in param_ids}
            opt_sd = optimizer.state_dict()  # a structure of references to the live state tensors
        self._scaler = copy.deepcopy(scaler.state_dict()) if scaler is not None else None
        self._rng = rng_state()
        self._out: tuple[dict[str, torch.Tensor], dict[str, Any], Any] | None = None
        self._error: BaseException | None = None
        args = (params, old_m, opt_sd, reuse.optimizer if reuse is not None else None)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._copy, args=args, name="torchparity-watch-snapshot", daemon=True)
            self._thread.start()
        else:
            self._copy(*args)
        self.cost = time.perf_counter() - t0

    def _copy(self, params: dict[str, torch.Tensor], old_m: dict[str, torch.Tensor], opt_sd: dict[str, Any],
              old_o: Any) -> None:
        c0 = time.perf_counter()
        try:
            with tool_work(), torch.no_grad():
                m = {k: _into_host(v, old_m.get(k)) for k, v in params.items()}
                o = _walk(opt_sd, old_o, _into_host)
                # copy what is not a tensor (hyperparameters); the host tensors are already copies,
                # and a second copy would read pinned buffers whose asynchronous copy is in flight
                keep: dict[int, Any] = {}
                _tree(o, lambda t: keep.setdefault(id(t), t))
                o = copy.deepcopy(o, keep)
                event = None
                if torch.cuda.is_available() and torch.cuda.is_initialized():  # copies from a GPU may be in flight
                    event = torch.cuda.Event()
                    event.record()
            self._out = (m, o, event)
        except BaseException as exc:  # re-raised on the training thread by result()
            self._error = exc
        self._copy_wall = time.perf_counter() - c0

    def result(self) -> State:
        """The snapshot (waits for the background copy)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.cost += self._copy_wall
        if self._error is not None:
            raise self._error
        assert self._out is not None
        m, o, event = self._out
        model = {k: (m[k] if k in m else self._buffers[k]) for k in self._keys}
        return State(model, o, self._scaler, self._rng, event)


def capture_state(model: torch.nn.Module, optimizer: Any, scaler: Any, reuse: State | None = None) -> State:
    """Copy the training state to the host now (without touching the user's tensors; the tool's
    own work: a dump or tracker running alongside does not see it). ``reuse``: a previous snapshot
    that is no longer needed, whose host tensors are written over instead of allocating new ones."""
    return SnapshotJob(model, optimizer, scaler, reuse, background=False).result()


def restore_state(st: State, model: torch.nn.Module, optimizer: Any, scaler: Any) -> None:
    """Write a captured state back into the user's model, optimizer and scaler (in place)."""
    st.ready()
    with tool_work(), torch.no_grad():
        live = model.state_dict(keep_vars=True)
        for k, v in st.model.items():
            live[k].data.copy_(v)
        for p in model.parameters():
            p.grad = None
        optimizer.load_state_dict(_tree(st.optimizer, lambda t: t.clone()))
        if scaler is not None and st.scaler is not None:
            scaler.load_state_dict(copy.deepcopy(st.scaler))
    if st.rng:
        set_rng_state(st.rng)


class History:
    """The snapshot taken every ``every`` steps (or less often, see :attr:`interval`) and the steps
    run since, within ``budget`` bytes."""

    def __init__(self, every: int, budget: int, share: float | None = None, max_every: int | None = None,
                 min_cost: float = 0.05) -> None:
        self.every, self.budget, self.min_cost = every, budget, min_cost
        #: a snapshot may cost at most this share of the steps between two snapshots (None: no bound)
        self.share = share
        self.max_every = max_every if max_every is not None else 10 * every
        #: steps between snapshots now: ``every``, stretched (up to ``max_every``) when a snapshot
        #: costs more than ``share`` of ``every`` steps
        self.interval = every
        self._cap = self.max_every  # the longest interval the memory budget allows (set at each snapshot)
        self.snapshot: State | None = None
        self.snapshot_step = -1
        self.steps: list[StepRecord] = []
        self.peak = 0  # the most host bytes held at once
        self._job: SnapshotJob | None = None
        self._snapshot_bytes = 0
        self._batches_bytes = 0  # bytes of the batches kept since the snapshot
        self._snapshot_cost = 0.0  # seconds the last snapshot cost (SnapshotJob.cost)
        self._step_time: float | None = None  # running mean of a step's wall time
        self._last_begin: float | None = None

    @property
    def nbytes(self) -> int:
        return self._snapshot_bytes + self._batches_bytes

    def begin_step(self, step: int, batch: Any, model: torch.nn.Module, optimizer: Any, scaler: Any) -> StepRecord:
        """Before ``step`` runs: start a snapshot when one is due (finished by :meth:`settle`),
        keep the step's batch and RNG states."""
        now = time.perf_counter()
        if self._last_begin is not None:
            dt = now - self._last_begin
            self._step_time = dt if self._step_time is None else 0.8 * self._step_time + 0.2 * dt
        self._last_begin = now
        if self.snapshot is None and self._job is None or step - self.snapshot_step >= self._due():
            self.settle()
            # checked before copying (the optimizer's state appears at its first step: at each snapshot)
            state_bytes = tree_bytes(model.state_dict()) + tree_bytes(optimizer.state_dict())
            batch_bytes = tree_bytes(batch)
            need = state_bytes + self.every * batch_bytes
            if need > self.budget:
                raise UsageError(f"watch: the snapshot and {self.every} kept batches need {need / 2**20:.1f} MiB on "
                                 f"the host, over memory_budget={self.budget / 2**20:.1f} MiB; raise memory_budget or "
                                 f"lower every")
            # a stretched interval keeps more batches: no more than the budget holds
            fit = (self.budget - state_bytes) // batch_bytes if batch_bytes else self.max_every
            self._cap = max(self.every, min(self.max_every, int(fit)))
            old, self.snapshot, self.steps, self._snapshot_bytes = self.snapshot, None, [], 0
            self._batches_bytes = 0
            self._job = SnapshotJob(model, optimizer, scaler, reuse=old)
            self.snapshot_step = step
        with tool_work():
            rec = StepRecord(step, _tree(batch, _to_host), _devices(batch), rng_state())
        self.steps.append(rec)
        self._batches_bytes += tree_bytes(rec.batch)  # one walk of the new batch, not of all kept ones per step
        return rec

    def settle(self) -> None:
        """Wait for the snapshot being taken, if any (before the optimizer step changes what it copies)."""
        if self._job is None:
            return
        job, self._job = self._job, None
        self.snapshot = job.result()
        self._snapshot_cost = job.cost
        self._snapshot_bytes = self.snapshot.nbytes  # counted once, not at every step

    def pause_timing(self) -> None:
        """The time until the next step begins is not a step's (a replay ran): do not count it."""
        self._last_begin = None

    def _due(self) -> int:
        """Steps from one snapshot to the next: ``every``, or more when the last snapshot cost more
        than ``share`` of the steps between (at most ``max_every`` and what the budget holds). A
        snapshot that cost at most ``min_cost`` seconds never spaces them out (small models keep
        exactly ``every``)."""
        if self.share is not None and self._step_time and self._snapshot_cost > self.min_cost:
            want = math.ceil(self._snapshot_cost / (self.share * self._step_time))
            self.interval = max(self.every, min(self._cap, want))
        return self.interval

    def note_peak(self) -> None:
        self.peak = max(self.peak, self.nbytes)
