"""The screen memo and the deferred chain of :class:`~torchparity.online.naninf.NanInfTracker`:
what each tensor value was found to hold, remembered per version and write generation, and CPU
outputs whose screen is left to the op that reads them."""

from __future__ import annotations

from contextlib import nullcontext as _nullcontext
from typing import Any

import torch

from ..capture.host_copies import _streams_for
from ..capture.op_stream import STREAM_KEY, written_tensors
from ..capture.tool_state import _tool_state
from .naninf_rules import (_EXTERNAL, _FINITE, _INF, _NAN, _PENDING, _PRESERVING, _OpInfo, _host_fact,
                           _screen, _screen_many)

#: screens per arena (a float32 device buffer; each screen is a 0-d view of one slot)
_ARENA = 4096
#: device screens queued before one batched reduction (:meth:`ScreenMemo._flush_screens`): at
#: most this many values, or this many bytes of them (a queued value stays alive until then)
_QUEUE_VALUES = 64
_QUEUE_BYTES = 256 << 20
#: the current stream of a CUDA device, as an int (cheap: no Stream object per screen)
_raw_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)


#: device type -> its torch device module (``torch.npu``, ``torch.musa``, ...), or None: no streams
_modules: dict[str, Any] = {}


def _device_module(device_type: str) -> Any:
    """The stream API of ``device_type`` as the dump's host copies find it (cached)."""
    if device_type not in _modules:
        s = _streams_for(device_type)
        _modules[device_type] = s.m if s is not None else None
    return _modules[device_type]


def _stream_key(device: torch.device) -> Any:
    """What orders work on ``device`` now: 0 on the CPU, the current stream on CUDA (its raw
    pointer: no Stream object per screen), ``(device index, stream id)`` of the device module's
    current stream on other accelerators (NPU, MUSA, ...); None where no stream can be told: the
    screens of such a device are not queued."""
    if device.type == "cpu":
        return 0
    if device.type == "cuda" and _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    m = _device_module(device.type)
    if m is None:
        return None
    try:
        s = m.current_stream(device)
        sid = getattr(s, "stream_id", None)
    except (RuntimeError, AttributeError, TypeError):
        return None
    return (getattr(s, "device_index", None), sid) if isinstance(sid, int) else None


def _current_stream(device: torch.device) -> Any:
    """The current stream object of an accelerator (None on the CPU), to run a queue on later."""
    m = _device_module(device.type) if device.type != "cpu" else None
    return m.current_stream(device) if m is not None else None


class ScreenMemo:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: screens, memo, deferred chain."""

    def _extends(self, info: _OpInfo, args: tuple, kwargs: dict) -> bool:
        """Does this op read the deferred chain's last output where a NaN/Inf always shows in
        its result (so that a finite result proves that output finite)?"""
        pos = _PRESERVING.get(info.base)
        if pos is None or (kwargs and any(k != "dtype" and k != "keepdim" and k != "dim"
                                                           for k in kwargs)):
            return False
        if info.base == "pow" and not (len(args) == 2 and type(args[1]) in (int, float) and args[1] > 0):
            return False
        tail = self._tail
        return any(i < len(args) and isinstance(args[i], torch.Tensor) and id(args[i]) in tail for i in pos)

    def _ctx(self, phase: str) -> tuple:
        """What names the running op later: (phase, module frame, autograd node), as the op
        stream's ``OpCall.where()`` would (it cannot be asked later: it reads what runs now)."""
        frame = self._tracker.current() if self._tracker is not None else None
        node = None
        if phase == "backward":
            try:
                node = torch._C._current_autograd_node()
            except (AttributeError, RuntimeError):
                node = None
        return (phase, frame, node)

    def _row_of(self, info: _OpInfo, n: int, ctx: tuple) -> tuple:
        """:meth:`_row` from a context captured by :meth:`_ctx` (the stream's module naming)."""
        phase, frame, node = ctx
        module, cls = (frame.path, frame.cls) if frame is not None else ("", None)
        if phase == "backward":
            try:
                tag = node.metadata.get(STREAM_KEY) if node is not None else None
            except (AttributeError, RuntimeError):
                tag = None
            module, cls = (tag[0], tag[1]) if tag else ("", None)
        return (info.prefix, info.base, n, info.op, module, cls, phase)

    def _resolve(self) -> None:
        """Judge the deferred chain: each link's output is non-finite only if the next link's is
        (it reads it through a preserving op), so one screen of the last output clears them all;
        otherwise every output is screened (none was written since) and judged in order."""
        chain = self._chain
        if not chain:
            return
        pend = self._pend
        self._chain, self._pend, self._tail = [], {}, set()
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            last = _host_fact(chain[-1][0])
            facts = [_FINITE] * len(chain) if last == _FINITE else [_host_fact(link[0]) for link in chain[:-1]] + [last]
        finally:
            state.busy -= 1
        masks = [0] * len(chain)
        for k, (_, info, n, seq, bad_in, bad_ext, deps, ctx, mask, create) in enumerate(chain):
            for d in deps:
                if facts[d]:
                    bad_in = True
                    mask |= masks[d]
            if bad_ext and self._host_entered is None:
                self._host_entered = (seq, self._row_of(info, n, ctx))
            if facts[k]:
                row = self._row_of(info, n, ctx)
                masks[k] = self._verdict(seq, row, facts[k], bad_in or bad_ext, create, mask, ctx[0], ctx[1])
        memo = self._memo
        for t, k in pend.values():
            e = memo.get(t)
            if e is not None and e[3] is _PENDING:
                memo[t] = (e[0], e[1], e[2], facts[k] | (masks[k] << 2), e[4])

    def _defer(self, t: torch.Tensor, info: _OpInfo, n: int, seq: int, phase: str, ins: list[tuple],
               bad_scalar: int) -> None:
        """Leave the screen of ``t`` (this op's only output, on the CPU) to its consumer."""
        step = self.current_step
        bad_in, bad_ext, deps, mask = bad_scalar == _INF, False, [], 0
        for e in ins:
            f = e[3]
            if f is _PENDING:
                deps.append(e[5])
            elif f:
                mask |= f >> 2
                if e[4] == step:
                    bad_in = True
                else:
                    bad_ext = True
        k = len(self._chain)
        self._chain.append([t, info, n, seq, bad_in, bad_ext, deps, self._ctx(phase), mask, bad_scalar == _NAN])
        self._remember(t, step, _PENDING, 0, k=k)
        self._tail = {id(t)}

    def _current(self, t: torch.Tensor, e: tuple) -> bool:
        """Does the memo entry ``e`` of ``t`` still describe its value?"""
        try:
            v = t._version
        except RuntimeError:  # inference tensors have no version counter
            v = None
        return e[0] == v and self._gen.get(e[1], 0) == e[2]

    def _entry(self, t: torch.Tensor) -> tuple:
        """``t``'s memo entry (version, storage ptr, write generation, fact, producer step) if
        current; else ``t`` is screened now (an input no tracked op produced since it changed)."""
        e = self._memo.get(t)
        if e is not None:
            try:
                v = t._version
            except RuntimeError:  # inference tensors have no version counter
                v = None
            if e[0] == v and self._gen.get(e[1], 0) == e[2]:
                return e
        b = t._base
        if b is not None and b.dtype == t.dtype:  # a view (autograd unpacks saved views anew)
            e = self._memo.get(b)
            if e is not None and e[3] is _FINITE and self._current(b, e):
                return self._remember(t, e[4], _FINITE, 0, e[1])  # part of a finite tensor
        e = self._remember(t, _EXTERNAL, None, 0)
        if self._wsites and type(e[3]) is int and e[3]:
            m = self._wsites.get(e[1])
            if m:  # a creation site wrote into this storage in place (``out[..., 3] = nan``)
                e = (e[0], e[1], e[2], e[3] | (m << 2), self.current_step)
                self._memo[t] = e
        elif self._wscreens and type(e[3]) is not int:
            ws = self._wscreens.get(e[1])
            if ws:  # the device path: values copied into this storage in place; the lineage
                # walk (SiteJudge._device_lineage) passes their sites on to this screen's readers
                self._lin_alias[id(e[3])] = (e[3], list(ws), e[1] in self._wtrunc)
        return e

    def _remember(self, t: torch.Tensor, producer: int, fact: Any, bump: int, ptr: int | None = None,
                  k: int = -1, version: int | None = None) -> tuple:
        """Screen ``t`` (unless ``fact`` is given) and remember it. ``bump``: 1 for a tensor a
        single-tensor op just wrote (its version counter is bumped after the mode returns).
        ``version``: the counter ``t`` will have once the dispatcher returns, for a view op's output
        (its base's: :func:`~torchparity.capture.measure_reuse.view_version`)."""
        try:
            if ptr is None:
                ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage (subclasses): not remembered
            ptr = -1
        if fact is None:
            fact = _host_fact(t) if t.is_cpu and self._host_read else self._device_screen(t, ptr)
        try:
            v = (t._version if version is None else version) + bump
        except RuntimeError:
            v = None
        if ptr < 0:
            return (v, -1, -1, fact, producer)
        if fact is _PENDING:  # deferred: the chain index rides along
            e = (v, ptr, self._gen.get(ptr, 0), fact, producer, k)
            self._pend[id(t)] = (t, k)
        else:
            e = (v, ptr, self._gen.get(ptr, 0), fact, producer)
        self._memo[t] = e
        return e

    def _device_screen(self, t: torch.Tensor, ptr: int = -1) -> torch.Tensor:
        """The screen of ``t`` (see :func:`~.naninf_rules._screen`): a 0-d float32 view of the next
        slot of an arena (one per device, dtype and stream), filled by the batched reduction of
        :meth:`_flush_screens`, which runs once per :data:`_QUEUE_VALUES` values (or
        :data:`_QUEUE_BYTES`), before any op writes into a queued value's storage, before any
        op outside aten (a collective), on a change of stream, and before the fold reads the
        screens. On a GPU host a reduction launched from Python costs ~20 us per value; the
        fold's stack of arena views is ~10x cheaper than a stack of separately allocated 0-d
        screens (bench/results/session16/). float64 values keep their own float64 screen (a
        finite float64 past float32's range must not read as Inf), as do values without a
        storage (``ptr`` < 0) and values on accelerators without a stream API
        (:func:`_stream_key`). A backend without the multi-tensor reduction gets plain screens."""
        if t.dtype is torch.float64 or ptr < 0:
            return _screen(t)
        dev = t.device
        if not t.numel():  # holds nothing (and a max-reduction of nothing is an error)
            return torch.zeros((), dtype=torch.float32, device=dev)
        stream = _stream_key(dev)
        if stream is None:
            return _screen(t)
        key = (dev, t.dtype)
        arenas = self._arenas
        a = arenas.get(key)
        if a is False:  # this device's batched reduction failed once: plain screens
            return _screen(t)
        if a is None or a[1] >= _ARENA or (a[2] and a[4] != stream):
            if self._queued_n:
                self._flush_screens()
            if a is None or a[1] >= _ARENA:
                with torch.inference_mode(False):
                    a = arenas[key] = [torch.empty(_ARENA, dtype=torch.float32, device=dev), 0, [], 0, stream, None]
        k = a[1]
        a[1] = k + 1
        q = a[2]
        if not q:  # a new queue: its first slot, and the stream it runs on
            a[3], a[4] = k, stream
            a[5] = _current_stream(dev)
        q.append(t)
        self._queued_ptrs.add(ptr)
        self._queued_n += 1
        self._queued_bytes += t.numel() * t.element_size()
        slot = a[0][k]
        if self._queued_n >= _QUEUE_VALUES or self._queued_bytes >= _QUEUE_BYTES:
            self._flush_screens()
        return slot

    def _flush_screens(self) -> None:
        """Run the queued screens: per arena one multi-tensor reduction into the queued slots
        (on the stream the values were queued on), then the values are let go."""
        self._queued_ptrs = set()
        self._queued_n = self._queued_bytes = 0
        failed = []
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            for key, a in self._arenas.items():
                if not a or not a[2]:
                    continue
                q, k0, stream = a[2], a[3], a[5]
                a[2] = []
                out = a[0][k0:k0 + len(q)]
                other = stream is not None and _stream_key(key[0]) != a[4]  # queued on another stream
                m = _device_module(key[0].type)
                with m.stream(stream) if other else _nullcontext(), torch.no_grad():
                    try:
                        _screen_many(q, out)
                    except (RuntimeError, NotImplementedError, TypeError):  # no batched reduction here
                        failed.append(key)
                        for i, t in enumerate(q):
                            out[i].copy_(_screen(t))
        finally:
            state.busy -= 1
        for key in failed:
            self._arenas[key] = False

    def _flush_before(self, args: tuple, kwargs: dict, info: _OpInfo) -> None:
        """Before an op that may write into a queued value (an in-place op or ``out=`` into its
        storage; any op outside aten, whose schema may not say what it writes): its screen runs
        first, on the value as the op that made it left it."""
        if info.foreign:
            self._flush_screens()
            return
        queued = self._queued_ptrs
        for t in written_tensors(args, kwargs, info.writes):
            if isinstance(t, torch.Tensor):
                try:
                    hit = t.untyped_storage().data_ptr() in queued
                except (RuntimeError, NotImplementedError, TypeError):
                    hit = True  # cannot tell: screen first
                if hit:
                    self._flush_screens()
                    return

    def _note_writes(self, args: tuple, kwargs: dict, writes: tuple) -> list[tuple[torch.Tensor, int, int]]:
        """Bump the write generation of every tensor the op wrote; returns (tensor, bump, ptr)."""
        gen = self._gen
        out = []
        for i, name, is_list in writes:
            v = args[i] if i < len(args) else kwargs.get(name)
            if v is None:
                continue
            for t in (v if is_list else (v,)):
                if isinstance(t, torch.Tensor):
                    try:
                        ptr = t.untyped_storage().data_ptr()
                    except (RuntimeError, NotImplementedError, TypeError):
                        continue
                    gen[ptr] = gen.get(ptr, 0) + 1
                    out.append((t, 0 if is_list else 1, ptr))
        return out
