"""Asynchronous copies of measured values to host memory (md5 and tensor modes).

On an accelerator, ``tensor.cpu()`` per value is a host sync per value. Here a value is brought to
the host without the training thread ever waiting for the device:

1. at measure time, a **device-side snapshot** (``clone``, one kernel on the current stream) fixes
   the value as it is now, so a later in-place write on the current stream cannot reach the copy;
2. a **side stream** waits on the current stream (``side.wait_stream(current)``: a device-side
   wait, no host sync) and copies the snapshot, ``non_blocking``, into a **pinned host buffer**
   taken from a :class:`HostPool`; the snapshot is kept from reuse by ``record_stream(side)`` (or
   a reference held until the copy is known to be done);
3. an **event** is recorded on the side stream after the copy. The writer thread waits on it
   (:meth:`HostCopy.tensor` / :meth:`HostCopy.checksum`), then hashes the bytes (md5 mode) or
   saves them (tensor mode), and gives the buffer back to the pool (:meth:`HostCopy.release`).

The pool has a byte budget (:data:`DEFAULT_BUDGET_BYTES`, counted in buffer sizes: powers of two).
When it is full, :meth:`HostCopier.copy` waits for the writer thread to give buffers back
(copies already handed to it, at most ``wait_s`` seconds), and beyond that returns None: the caller
then copies blocking, as without this module. Host memory held by copies never exceeds the budget.

On the CPU (``device_stats=True``: the accelerator path forced, for tests and the counting bench)
the copy into the pool buffer is synchronous and needs neither snapshot nor event; the same
writer-side finishing runs. The stream operations are behind :class:`Streams`, so a test can hand
in a fake whose copies only happen when its event is waited on (the ordering logic, tested on a
machine without an accelerator).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from .stats import checksum_bytes

DEFAULT_BUDGET_BYTES = 256 << 20  # pinned host bytes held by copies not yet finished by the writer
DEFAULT_WAIT_S = 5.0  # how long a full pool waits for the writer to give buffers back
_MIN_CLASS = 1 << 12  # smallest buffer (bytes); buffers are powers of two from there
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _size_class(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (nbytes - 1).bit_length())


class HostPool:
    """Host buffers (uint8, pinned where asked and possible) under one byte budget, shared by the
    training thread (:meth:`take`) and the writer thread (:meth:`give`).

    ``in_use`` counts buffers taken and not given back, ``cached`` free buffers kept for reuse
    (dropped first when a new buffer would pass the budget), ``unhanded`` the part of ``in_use``
    whose copies the writer does not hold yet (waiting for those would wait for nothing)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be a positive int (got {budget_bytes!r})")
        self.budget = budget_bytes
        self.in_use = 0
        self.cached = 0
        self.unhanded = 0
        self.waits = 0  # times the training thread waited for the writer (for tests and the bench)
        self._stalled = False  # a wait timed out: do not wait again until a buffer comes back
        self._free: dict[tuple[bool, int], list[torch.Tensor]] = {}
        self._cond = threading.Condition()

    def take(self, nbytes: int, pinned: bool, wait_s: float) -> torch.Tensor | None:
        """A buffer of at least ``nbytes`` bytes, or None when the budget cannot hold it (after
        waiting up to ``wait_s`` seconds for buffers the writer holds)."""
        cls = _size_class(nbytes)
        if cls > self.budget:
            return None
        with self._cond:
            deadline = None
            while True:
                free = self._free.get((pinned, cls))
                if free:  # a buffer of this size came back: reuse it
                    self.cached -= cls
                    self._use(cls)
                    return free.pop()
                if self.in_use + self.cached + cls <= self.budget:
                    break
                if self.cached:
                    self._drop_cached()
                    continue
                if self._stalled or self.in_use - self.unhanded <= 0:
                    return None  # nothing the writer could give back (soon)
                deadline = deadline if deadline is not None else time.monotonic() + wait_s
                left = deadline - time.monotonic()
                self.waits += 1
                if left <= 0 or not self._cond.wait(left):
                    self._stalled = True
                    return None
            self._use(cls)
        try:
            return _alloc(cls, pinned)
        except RuntimeError:  # no pinned memory left / no pinning on this machine
            with self._cond:
                self.in_use -= cls
                self.unhanded -= cls
            return None

    def _use(self, cls: int) -> None:
        self.in_use += cls
        self.unhanded += cls

    def _drop_cached(self) -> None:
        self._free.clear()  # back to torch's (caching) host allocator
        self.cached = 0

    def handed(self) -> None:
        """Every buffer taken so far belongs to copies now handed to the writer thread."""
        with self._cond:
            self.unhanded = 0

    def give(self, buf: torch.Tensor | None, nbytes_class: int, reuse: bool) -> None:
        """A buffer comes back (``reuse``: its copy is known complete, so it may be handed out
        again; otherwise it is only forgotten)."""
        with self._cond:
            self.in_use -= nbytes_class
            self.unhanded = min(self.unhanded, self.in_use)
            if reuse and buf is not None and self.in_use + self.cached + nbytes_class <= self.budget:
                self._free.setdefault((buf.is_pinned(), nbytes_class), []).append(buf)
                self.cached += nbytes_class
            self._stalled = False
            self._cond.notify_all()


def _alloc(nbytes: int, pinned: bool) -> torch.Tensor:
    with torch.inference_mode(False):  # a buffer made in inference mode could not be written outside it
        if pinned:
            try:
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # this device cannot pin: plain memory (the copy is then synchronous)
                pass
        return torch.empty(nbytes, dtype=torch.uint8)


class Streams:
    """Stream and event operations of one device type (``torch.cuda``, or the generic device
    module of ``torch.get_device_module`` for other accelerators: NPU, XPU, ...)."""

    def __init__(self, module: Any) -> None:
        self.m = module
        self._side: dict[Any, Any] = {}

    def current(self, device: torch.device) -> Any:
        return self.m.current_stream(device)

    def side(self, device: torch.device) -> Any:
        s = self._side.get(device)
        if s is None:
            s = self._side[device] = self.m.Stream(device=device)
        return s

    def copy_after(self, side: Any, current: Any, dst: torch.Tensor, src: torch.Tensor) -> Any:
        """On ``side``: wait for ``current``'s work so far, copy ``src`` into ``dst``
        (non_blocking), record an event; returns the event."""
        side.wait_stream(current)
        with self.m.stream(side):
            dst.copy_(src, non_blocking=True)
            ev = self.m.Event()
            ev.record(side)
        return ev


def _streams_for(device_type: str) -> Streams | None:
    """The stream API of ``device_type``, or None (the CPU; a device without streams/events)."""
    if device_type == "cpu":
        return None
    if device_type == "cuda":
        return Streams(torch.cuda)
    get = getattr(torch, "get_device_module", None)  # torch >= 2.3
    try:
        m = get(device_type) if get is not None else getattr(torch, device_type, None)
    except (RuntimeError, AttributeError):
        m = None
    if m is None or not all(hasattr(m, a) for a in ("current_stream", "Stream", "stream", "Event")):
        return None
    return Streams(m)


class HostCopy:
    """One value's bytes on their way to host memory (finished by the writer thread)."""

    __slots__ = ("nbytes", "_dtype", "_shape", "_buf", "_cls", "_event", "_keep", "_pool", "_checksum", "_done")

    def __init__(self, buf: torch.Tensor, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...],
                 event: Any, keep: Any, pool: HostPool) -> None:
        self.nbytes = nbytes
        self._dtype, self._shape = dtype, shape
        self._buf: torch.Tensor | None = buf
        self._cls = buf.numel()
        self._event = event  # None: the copy is complete
        self._keep = keep  # the device snapshot, where it could not be handed to record_stream
        self._pool: HostPool | None = pool
        self._checksum: str | None = None
        self._done = event is None

    def _wait(self) -> None:
        if not self._done:
            self._event.synchronize()
            self._done, self._event, self._keep = True, None, None

    def tensor(self) -> torch.Tensor | None:
        """The value on the host (a view of the pool buffer: valid until :meth:`release`)."""
        if self._buf is None:
            return None
        self._wait()
        return self._buf[:self.nbytes].view(self._dtype).view(self._shape)

    def checksum(self) -> str | None:
        """:func:`~.stats.tensor_checksum` of the value (computed once; None if the buffer was
        released before anyone asked: the batch was dropped)."""
        if self._checksum is None and self._buf is not None:
            self._wait()
            self._checksum = checksum_bytes(self._buf[:self.nbytes].numpy())
        return self._checksum

    def release(self) -> None:
        """Give the buffer back to the pool (idempotent). A buffer whose copy was never waited on
        is not reused (the device may still be writing it)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            buf, self._buf = self._buf, None
            pool.give(buf, self._cls, reuse=self._done)
            self._event = self._keep = None

    def __del__(self) -> None:  # a copy dropped unfinished (its record was never committed)
        try:
            self._done = False  # never reuse: nobody waited for it
            self.release()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class HostCopier:
    """Copies measured values to host buffers without a host sync on the training thread."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, wait_s: float = DEFAULT_WAIT_S,
                 streams: Streams | Any | None = None) -> None:
        self.pool = HostPool(budget_bytes)
        self.wait_s = wait_s
        self._forced = streams  # tests: used for every device, the CPU included
        self._streams: dict[str, Streams | None] = {}
        self.copies = 0  # values copied through the pool (for tests and the bench)
        self.declined = 0  # values the caller had to copy blocking (pool full, unsupported value)

    @staticmethod
    def supports(v: torch.Tensor) -> bool:
        """Values whose raw bytes a pool buffer can take (plain strided tensors with elements)."""
        return type(v) in _PLAIN and v.layout == torch.strided and v.numel() > 0 \
            and v.device.type != "meta" and not v.is_conj() and not v.is_neg()

    def copy(self, v: torch.Tensor) -> HostCopy | None:
        """Start copying ``v`` (its value now) to the host; None: copy it blocking instead."""
        if not self.supports(v):
            self.declined += 1
            return None
        dev = v.device
        streams = self._forced
        if streams is None:
            if dev.type not in self._streams:
                self._streams[dev.type] = _streams_for(dev.type)
            streams = self._streams[dev.type]
            if streams is None and dev.type != "cpu":  # a device without streams/events
                self.declined += 1
                return None
        nbytes = v.numel() * v.element_size()
        buf = self.pool.take(nbytes, pinned=dev.type != "cpu", wait_s=self.wait_s)
        if buf is None:
            self.declined += 1
            return None
        shape = tuple(v.shape)
        dst = buf[:nbytes].view(v.dtype).view(shape)
        v = v.detach()
        event = keep = None
        with torch.no_grad():
            if streams is None:  # the CPU: a synchronous copy is the snapshot
                dst.copy_(v)
            else:
                snap = v.clone(memory_format=torch.contiguous_format)  # the value as measured
                event = streams.copy_after(streams.side(dev), streams.current(dev), dst, snap)
                keep = snap
                if type(streams) is Streams:
                    try:  # the allocator keeps the snapshot until the side stream is done with it
                        snap.record_stream(streams.side(dev))
                        keep = None
                    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
                        pass  # held by the HostCopy until its event is waited on
        self.copies += 1
        return HostCopy(buf, nbytes, v.dtype, shape, event, keep, self.pool)

    def handed(self) -> None:
        """The copies made so far now travel with a batch to the writer thread."""
        self.pool.handed()


def host_tensor(t: Any) -> torch.Tensor:
    """A batch's saved tensor on the host: waits for a :class:`HostCopy` (writer thread)."""
    if isinstance(t, HostCopy):
        out = t.tensor()
        if out is None:
            raise RuntimeError("a host copy was released before it was saved")
        return out
    return t


def release_copies(tensors: dict[str, Any], checksums: list[tuple[Any, Any]]) -> None:
    """Give back the buffers of a finished (written or dropped) batch."""
    for t in tensors.values():
        if isinstance(t, HostCopy):
            t.release()
    for _, c in checksums:
        if isinstance(c, HostCopy):
            c.release()
