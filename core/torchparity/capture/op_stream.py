"""The op stream: every aten op of the model intercepted once, handed to every consumer.

One :class:`~torch.utils._python_dispatch.TorchDispatchMode` (:class:`OpStream`'s mode) sees each
kernel call. What every consumer needs to know about the call is worked out once and shared
through an :class:`OpCall`: what the op is (:class:`OpInfo`, once per overload: its dump-style
prefix and base name, view / in-place / written arguments / random / collective), the phase
(forward, backward, recompute, optimizer), its dump-style name within the step
(``Aten.mm.3.forward``: one counter per ``(prefix, base, phase)``, reset at each step end, so a
NaN finding, an online-compare failure, an emulated fault index and a dump record of the same op
carry the same name), and its module (path and class, lazily: only a consumer that asks pays).

Consumers (the dump's aten sink, the NaN/Inf screen, online compare, the emulated device's
computation, a third party's) subclass :class:`OpConsumer` and are :meth:`attached
<OpStream.attach>` for as long as they run. They form a chain, ordered by :attr:`OpConsumer.layer`
(observers outside, a consumer that changes how ops compute, such as the emulated device,
innermost, so that observers see what the device computed) and then by attach order; each one's
:meth:`~OpConsumer.on_op` gets the call and a ``run(*args, **kwargs)`` that runs the rest of the
chain and, at its end, the kernel. Running the dump, the NaN tracker and online compare together
costs one interception.

While a consumer's ``on_op`` runs, the stream's mode is off the mode stack (that is how dispatch
modes work), so the tool's own computations (statistics, screens, reference ops) are never
intercepted by the stream; :func:`~torchparity.capture.session.tool_work` still marks them for
any *other* mode below.

The stream also keeps what every consumer needs to trust a measurement across ops: a write
generation per storage (:meth:`OpStream.storage_generation`), bumped after every op that writes
into a tensor (from the op schema's alias info), so "this value was already measured" is decided
from one table.

``capture/`` imports nothing from ``dump/``, ``online/``, ``compare/`` or ``cli/``: consumers are
handed to the stream, never looked up by it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import gc_quiet
from .mode_stacks import insert_back
from .compiled import (COMPILED_MODULES_RUN, CompiledCallGuard, eager_hook, quiet_compiled, refuse_compiled,
                       restore_classes, warn_if_compiled_functions_run_eagerly)
from . import ops as opinfo
from .op_call import (LAYER_DEVICE, LAYER_OBSERVER, UNCOUNTED_OPS, OpCall, OpConsumer,  # noqa: F401 (re-exported)
                      OpInfo, make_info as _make_info)
from .module_tracker import Frame, ModuleTracker, _graph_task_id, in_backward, tag_graph
from .tool_state import _tool_state, tool_is_busy  # noqa: F401 (tool_is_busy re-exported)

#: the key under which the stream tags autograd nodes with the module that created them
STREAM_KEY = "torchparity.stream"

class _Next:
    """``run`` handed to consumer ``i``: calls consumer ``i + 1`` (or the kernel)."""

    __slots__ = ("chain", "i", "call", "func")

    def __init__(self, chain: tuple[OpConsumer, ...], i: int, call: OpCall, func: Any) -> None:
        self.chain, self.i, self.call, self.func = chain, i, call, func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        i = self.i
        if i >= len(self.chain):
            return self.func(*args, **kwargs)
        return self.chain[i].on_op(self.call, args, kwargs, _Next(self.chain, i + 1, self.call, self.func))


#: what the stream's consumers are, in the refusal of a compiled model
_STREAM_TOOLS = "an op-level capture (aten-level dump, NaN/Inf tracker, online compare, emulated device)"


class _StreamMode(TorchDispatchMode):
    def __init__(self, stream: "OpStream") -> None:
        super().__init__()
        self.stream = stream

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        stream = self.stream
        if stream._all_paused:  # every consumer paused (OpStream.pause): the kernel, nothing else
            return func(*args, **(kwargs or {}))
        return stream._dispatch(func, args, kwargs or {})

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """A ``torch.compile``'d function called under the mode runs compiled, as without the tool
        (Dynamo would skip its frames: eager numerics). Asked from torch 2.9 on: :mod:`.compiled`."""
        return True

    # Code written for the time when the emulated device was a dispatch mode of its own looks for
    # ``torchparity_emulated`` on the mode stack: the stream's mode answers for its consumers.
    @property
    def torchparity_emulated(self) -> bool:
        return self.stream.emulation() is not None

    @property
    def emulated_dtype(self) -> Any:
        return getattr(self.stream.emulation(), "emulated_dtype", None)

    @property
    def faults(self) -> list:
        return list(getattr(self.stream.emulation(), "faults", []) or [])


class OpStream:
    """The process's op stream (get it with :func:`op_stream`)."""

    def __init__(self) -> None:
        self._consumers: list[OpConsumer] = []
        self._chain: tuple[OpConsumer, ...] = ()
        self._mode: _StreamMode | None = None
        self._paused: set[int] = set()  # ids of consumers that need no op for now (pause())
        self._all_paused = False  # every attached consumer is paused: ops pass straight through
        self._off = False  # paused off the dispatch-mode stack (it was on top when all paused)
        self._left: list[Any] = []  # the stack as the mode left it (what it goes back on top of)
        self._raw = False  # put back under modes entered meanwhile, by the stack's own push (see _back)
        self._infos: dict[int, OpInfo] = {}
        self._keep: list[Any] = []  # overloads whose id() keys _infos
        self._counters: dict[tuple[str, str, str], int] = {}
        self._write_gen: dict[int, int] = {}
        self._lock = threading.RLock()
        self.step = 0
        self.in_optimizer = False
        self._first_optimizer: Any = None  # weakref to the optimizer whose step() ends a step
        self._stepped: set[int] = set()  # ids of optimizers that stepped since the last step end
        self._hooks: list[Any] = []
        self.tracker: ModuleTracker | None = None
        self._roots: list[torch.nn.Module] = []
        self._walked: dict[int, tuple[Any, list[Any]]] = {}  # tag_graph's per-call walks (its ``walked``)
        #: interceptions so far (what the counting bench reads)
        self.intercepted = 0
        self._compiled_guard = CompiledCallGuard(_STREAM_TOOLS, allowed=self._compiled_modules_run)
        self._quieted: list[Any] = []  # compiled modules given quiet_class, put back at _stop

    # ---- consumers ---------------------------------------------------------------------------
    @property
    def consumers(self) -> tuple[OpConsumer, ...]:
        return self._chain

    def attach(self, consumer: OpConsumer, model: torch.nn.Module | None = None) -> None:
        """Add ``consumer`` to the chain (the stream's mode is entered by the first one). With
        ``model``, modules are named by their path in it."""
        with self._lock:
            if consumer in self._consumers:
                return
            if not (COMPILED_MODULES_RUN and consumer.sees_compiled_modules):
                refuse_compiled(model, getattr(consumer, "tool_name", _STREAM_TOOLS),
                                getattr(consumer, "compiled_hint", ""))
            elif model is not None:
                self._quieted += quiet_compiled(model)
            self._consumers.append(consumer)
            self._chain = tuple(sorted(self._consumers, key=lambda c: c.layer))  # stable: attach order
            if model is not None and not any(r is model for r in self._roots):
                self._roots.append(model)
                if self.tracker is not None:
                    self.tracker.add_root(model)
            if consumer.needs_modules and self.tracker is None:
                self._start_tracker()
            self._refresh_paused()  # a consumer that needs ops: ops go to the chain again
            if len(self._consumers) == 1:
                self._start()

    def detach(self, consumer: OpConsumer) -> None:
        """Remove ``consumer``; the last one out leaves the mode stack (if the stream's mode is on
        top of it; otherwise the mode stays as a pass-through until it can leave)."""
        with self._lock:
            if consumer not in self._consumers:
                return
            self._consumers.remove(consumer)
            self._paused.discard(id(consumer))
            self._chain = tuple(sorted(self._consumers, key=lambda c: c.layer))
            self._refresh_paused()
            try:
                consumer.on_detach()
            finally:
                if self.tracker is not None and not any(c.needs_modules for c in self._consumers):
                    self.tracker.stop()
                    self.tracker = None
                    self._walked.clear()
                if not self._consumers:
                    self._stop()

    def _compiled_modules_run(self) -> bool:
        """May a compiled module run compiled now (every consumer sees it as it is)?"""
        return COMPILED_MODULES_RUN and all(c.sees_compiled_modules for c in self._consumers)

    def emulation(self) -> OpConsumer | None:
        """The innermost attached consumer that emulates a device (``torchparity_emulated``), if
        any: the dump header, online compare and the NaN tracker ask what it computes in
        (``emulated_dtype``)."""
        for c in reversed(self._chain):
            if getattr(c, "torchparity_emulated", False):
                return c
        return None

    def changes_numerics(self) -> bool:
        """Is a consumer attached that may change what ops compute (layer above
        :data:`LAYER_OBSERVER`)?"""
        return any(c.layer > LAYER_OBSERVER for c in self._chain)

    def attached(self, consumer: OpConsumer, model: torch.nn.Module | None = None) -> "_Attached":
        """``with stream.attached(consumer): ...``"""
        return _Attached(self, consumer, model)

    # ---- lifecycle ---------------------------------------------------------------------------
    def _start(self) -> None:
        import torch.optim.optimizer as optim_mod

        self.step = 0
        self._counters.clear()
        self._write_gen.clear()
        self.in_optimizer = False
        self._first_optimizer = None
        self._stepped.clear()
        self._hooks = [optim_mod.register_optimizer_step_pre_hook(eager_hook(self._on_opt_pre)),
                       optim_mod.register_optimizer_step_post_hook(eager_hook(self._on_opt_post))]
        if self._mode is None:
            self._mode = _StreamMode(self)
            self._mode.__enter__()
            self._off = self._raw = False
        elif self._off:  # a paused stream, left off the stack, restarted
            self._back()
        gc_quiet.hold()  # the collector skips the process's old heap while consumers capture
        self._compiled_guard.install()  # a compiled module would run eagerly under the mode: refuse it

    def _stop(self) -> None:
        gc_quiet.release()
        self._compiled_guard.remove()
        restore_classes(self._quieted)
        self._quieted = []
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._roots = []
        self._paused.clear()
        self._all_paused = False
        mode = self._mode
        if mode is not None and self._off:  # paused: already off the stack
            self._mode = None
            self._off = False
        elif mode is not None and _top_mode() is mode:
            self._mode = None
            self._leave_stack(mode)
        # else: another mode was entered after ours and is still active; ours stays below it as
        # a pass-through (no consumers) and is reused by the next attach

    # ---- pausing -------------------------------------------------------------------------------
    def pause(self, consumer: OpConsumer) -> None:
        """``consumer`` needs no op until it calls :meth:`resume` (a scheduled dump between its
        full steps). While every attached consumer is paused the stream's mode leaves the
        dispatch-mode stack when it is on top of it (ops run without any interception), else it
        stays and hands each op straight to its kernel. It goes back where it was when a
        consumer resumes or attaches (:meth:`_back`). A paused consumer sees none of the ops
        meanwhile: not their writes, not their allocations."""
        with self._lock:
            if consumer in self._consumers:
                self._paused.add(id(consumer))
                self._refresh_paused()

    def resume(self, consumer: OpConsumer) -> None:
        """``consumer`` needs every op again."""
        with self._lock:
            self._paused.discard(id(consumer))
            self._refresh_paused()

    @property
    def intercepting(self) -> bool:
        """Are ops handed to the consumers (the mode is on the stack and not every consumer is
        paused)?"""
        return self._mode is not None and not self._off and bool(self._consumers) and not self._all_paused

    def _refresh_paused(self) -> None:
        self._all_paused = bool(self._consumers) and all(id(c) in self._paused for c in self._consumers)
        mode = self._mode
        if mode is None or not self._consumers:  # the last one out: _stop() takes the mode off
            return
        if self._all_paused and not self._off and _top_mode() is mode:
            self._leave_stack(mode)
            self._off = True
            self._left = _mode_stack()
        elif not self._all_paused and self._off:
            self._back()

    def _leave_stack(self, mode: "_StreamMode") -> None:
        if self._raw:  # put back by the stack's own push: taken off the same way
            from torch.utils._python_dispatch import _pop_mode

            _pop_mode()
            self._raw = False
        else:
            mode.__exit__(None, None, None)

    def _back(self) -> None:
        """Put the mode back where it left the stack. Modes the user entered meanwhile and has
        not exited yet stay above it: they are taken off and pushed back by the stack's own
        functions (their ``__enter__``/``__exit__`` never run), so each one's ``with`` still
        unwinds it from the top."""
        mode = self._mode
        assert mode is not None
        now = _mode_stack()
        self._off = False
        if len(now) == len(self._left) and all(a is b for a, b in zip(now, self._left)):
            mode.__enter__()  # the stack is as the mode left it: back on top, the ordinary way
            return
        from torch.utils._python_dispatch import _pop_mode, _push_mode

        insert_back(mode, now, self._left, _pop_mode, _push_mode)
        self._raw = True

    def _start_tracker(self) -> None:
        t = ModuleTracker()
        t.want_seq = True
        for r in self._roots:
            t.add_root(r)
        t.on_exit.append(self._tag_backward)
        t.start()
        self.tracker = t

    def _tag_backward(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        if self._all_paused:  # no consumer sees this step's ops: no backward op to attribute
            return
        walked = self._walked
        tag_graph(output, (frame.path, frame.cls), key=STREAM_KEY, since=frame.seq0, walked=walked)
        if walked and self.tracker is not None and not self.tracker.stack:  # the outermost module returned
            walked.clear()

    # ---- steps -------------------------------------------------------------------------------
    def next_step(self) -> None:
        """End the current step: every consumer's :meth:`~OpConsumer.on_step_end` (all of them,
        even when one raises: the first error is raised once the step has ended), then the
        counters reset."""
        error: BaseException | None = None
        warn_if_compiled_functions_run_eagerly(_STREAM_TOOLS)
        for c in self._chain:
            try:
                c.on_step_end(self.step)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the step ended
                if error is None:
                    error = exc
        self.step += 1
        self._counters.clear()
        self._stepped.clear()
        if self.tracker is not None:
            self.tracker.new_step()
        if error is not None:
            raise error

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_optimizer = True

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Several optimizers: the step ends after the first one's ``step()`` (one step per
        iteration). The first is the first to step after the stream started; it is replaced when
        it is gone (garbage-collected) or when another optimizer steps twice without it (the
        training loop moved on to a new optimizer)."""
        self.in_optimizer = False
        first = self._first_optimizer() if self._first_optimizer is not None else None
        if first is None or (first is not optimizer and id(optimizer) in self._stepped):
            self._first_optimizer = weakref.ref(optimizer)
            first = optimizer
        if first is optimizer:
            self.next_step()
        else:
            self._stepped.add(id(optimizer))

    # ---- per op ------------------------------------------------------------------------------
    def info(self, func: Any) -> OpInfo:
        """The :class:`OpInfo` of an overload (cached)."""
        i = self._infos.get(id(func))  # OpOverload.__hash__ is Python code; overloads live forever
        if i is None:
            i = self._infos[id(func)] = _make_info(func)
            self._keep.append(func)
        return i

    def phase(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if in_backward():
            t = self.tracker
            frame = t.current() if t is not None else None
            return "recompute" if frame is not None and frame.recompute else "backward"
        return "forward"

    def module_of(self, phase: str) -> tuple[str, str | None]:
        t = self.tracker
        if t is None:
            return "", None
        if phase == "backward":
            try:
                node = torch._C._current_autograd_node()
                tag = node.metadata.get(STREAM_KEY) if node is not None else None
            except (AttributeError, RuntimeError):
                tag = None
            return (tag[0], tag[1]) if tag else ("", None)
        frame = t.current()
        return (frame.path, frame.cls) if frame is not None else ("", None)

    def storage_generation(self, t: torch.Tensor) -> int:
        """How many writes the stream has seen into ``t``'s storage (0: none)."""
        return self._write_gen.get(opinfo.storage_ptr(t), 0)

    def note_writes(self, tensors: Iterable[Any]) -> None:
        """Tensors written outside the stream's sight (by the tool's consumers' own bookkeeping)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                p = opinfo.storage_ptr(t)
                if p:
                    self._write_gen[p] = self._write_gen.get(p, 0) + 1

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        chain = self._chain
        if not chain or getattr(_tool_state, "busy", 0) > 0:  # tool_is_busy(), inlined
            return func(*args, **kwargs)
        self.intercepted += 1
        info = self._infos.get(id(func))
        if info is None:
            info = self.info(func)
        if info.counted:
            # self.phase(), its common case inlined: outside the optimizer and any backward
            if not self.in_optimizer and _graph_task_id is not None and _graph_task_id() == -1:
                phase = "forward"
            else:
                phase = self.phase()
            key = (info.prefix, info.base, phase)
            n = self._counters.get(key, 0)
            self._counters[key] = n + 1
        else:
            phase, n = "", -1
        call = OpCall(info, phase, n, self)
        if len(chain) == 1:
            out = chain[0].on_op(call, args, kwargs, func)
        else:
            out = chain[0].on_op(call, args, kwargs, _Next(chain, 1, call, func))
        if info.writes:
            self.note_writes(written_tensors(args, kwargs, info.writes))
        return out


def written_tensors(args: tuple, kwargs: dict, writes: tuple[tuple[int, str, bool], ...],
                    lists: bool = True) -> list[Any]:
    """The tensors in the written argument positions (``OpInfo.writes``); tensor lists flattened,
    or left out with ``lists=False``."""
    out: list[Any] = []
    for i, name, is_list in writes:
        if is_list and not lists:
            continue
        v = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(v, (list, tuple)):
            out.extend(v)
            if v and isinstance(v[0], (list, tuple)):  # distdump: c10d's Tensor[][] outputs (allgather_)
                out[len(out) - len(v):] = [t for x in v for t in x]
        elif v is not None:
            out.append(v)
    return out


def is_stream_mode(mode: Any) -> bool:
    """Is ``mode`` (an entry of the dispatch-mode stack) the op stream's own mode?"""
    return isinstance(mode, _StreamMode)


def _mode_stack() -> list[Any]:
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return list(_get_current_dispatch_mode_stack())
    except Exception:  # pragma: no cover - private API moved
        return []


def _top_mode() -> Any:
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        stack = _get_current_dispatch_mode_stack()
        return stack[-1] if stack else None
    except Exception:  # pragma: no cover - private API moved
        return None


class _Attached:
    def __init__(self, stream: OpStream, consumer: OpConsumer, model: torch.nn.Module | None) -> None:
        self.stream, self.consumer, self.model = stream, consumer, model

    def __enter__(self) -> OpConsumer:
        self.stream.attach(self.consumer, self.model)
        return self.consumer

    def __exit__(self, *exc: Any) -> None:
        self.stream.detach(self.consumer)


_STREAM = OpStream()


def op_stream() -> OpStream:
    """The process's op stream."""
    return _STREAM
