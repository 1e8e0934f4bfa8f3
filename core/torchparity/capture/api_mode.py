"""API-level capture: a TorchFunctionMode that records torch.*, torch.nn.functional.* and Tensor
method calls as the user wrote them (``Functional.linear.3.forward``).

Only the outermost call is recorded (inside a handler the mode is off, so ``F.linear`` calling
other torch functions is one record). Calls that return no tensor (``size()``, ``dim()``) and
attribute access are passed through untouched.

Backward: for an out-of-place call whose inputs require grad, :mod:`.grad_capture` observes the
autograd nodes the call created, so the op's backward record holds exactly this op's gradients
(its VJP: grad outputs as inputs, grad inputs as outputs), not the total gradient of a tensor used
in several places. Only hooks that read are added: the model's results stay bitwise identical.

Uninitialised memory: the results of ``torch.empty*`` / ``Tensor.new_empty*`` and every later read
of their storage before a write (MoE routers: ``inv = torch.empty_like(perm); inv[perm] = ...``)
are described, never measured, exactly as at the aten level (the same :class:`.uninit.UninitStorages`
bookkeeping, no extra device work); the record says why in ``flags["unmeasured"]``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.overrides import _pop_mode as _pop_function_mode
from torch.overrides import _push_mode as _push_function_mode

from ..records import OpRecord
from .aten_mode import (_ALL_OUTPUTS, _OVERWRITING, _UNINITIALIZED_RESULT, _WHY_OUT, _WHY_OVERWRITTEN,
                         _WHY_UNINIT)
from .grad_capture import GradWatch, next_sequence_nr, watch_call
from .mode_stacks import insert_back, take_out
from .compiled import is_compiling
from .compute_dtype import call_flags
from .module_tracker import tag_graph
from .flatten import flat_args, flat_outputs
from .session import CaptureSession
from .tool_state import tool_is_busy

_PASSTHROUGH = frozenset({
    "__get__", "__set__", "__repr__", "__format__", "__str__", "__len__", "__bool__", "__index__",
    "__int__", "__float__", "__hash__", "__iter__", "__contains__", "__array__", "__reduce_ex__",
    "__deepcopy__", "__setstate__", "size", "dim", "numel", "stride", "data_ptr", "is_contiguous",
    "element_size", "storage_offset", "is_floating_point", "is_complex", "tolist", "item", "untyped_storage",
    "_storage", "register_hook", "register_post_accumulate_grad_hook", "requires_grad_", "retain_grad",
    "backward", "detach", "detach_", "is_leaf", "grad_fn", "nelement", "ndimension", "get_device",
    "type", "is_set_to", "_is_view", "_version", "has_names", "__dlpack__", "__dlpack_device__",
    "numpy", "cpu_", "_typed_storage", "share_memory_", "pin_memory", "is_pinned", "_fix_weakref",
})


def classify(func: Any) -> tuple[str, str, str] | None:
    """(prefix, base name, op id) for a torch function, or None to pass it through."""
    name = getattr(func, "__name__", None)
    if name is None or name in _PASSTHROUGH or name.startswith("_record_function"):
        return None
    module = getattr(func, "__module__", None) or ""
    objclass = getattr(func, "__objclass__", None)
    qual = getattr(func, "__qualname__", "") or ""
    # torch < 2.2 calls the C base class _TensorBase
    if objclass is not None and objclass.__name__ in ("TensorBase", "_TensorBase", "Tensor") \
            or qual.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return "Tensor", name, f"torch.Tensor.{name}"
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return "Functional", name, f"torch.nn.functional.{name}"
    if module.startswith("torch.distributed"):
        return "Distributed", name, f"{module}.{name}"
    if module.startswith("torch._C._linalg") or module.startswith("torch.linalg"):
        return "Torch", f"linalg.{name}", f"torch.linalg.{name}"
    if module.startswith("torch._C._fft") or module.startswith("torch.fft"):
        return "Torch", f"fft.{name}", f"torch.fft.{name}"
    if module.startswith("torch._C._special") or module.startswith("torch.special"):
        return "Torch", f"special.{name}", f"torch.special.{name}"
    return "Torch", name, f"torch.{name}"


_NO_VALUE_OUT = {"out": _WHY_OUT}
_NO_VALUE_RESULT = dict.fromkeys(_ALL_OUTPUTS, _WHY_UNINIT)


def _overwritten(flat: list[tuple[str, Any]]) -> dict[str, str]:
    """The destination of an op that overwrites it (its first tensor argument, whatever its name)."""
    for arg, v in flat:
        if isinstance(v, torch.Tensor):
            return {arg: _WHY_OVERWRITTEN, "out": _WHY_OUT}
    return _NO_VALUE_OUT


@functools.lru_cache(maxsize=4096)
def _cached_classify(func: Any) -> tuple[str, str, str] | None:
    return classify(func)


#: names that end like an in-place method but write no values (metadata, autograd flags)
_NOT_WRITING = frozenset({"requires_grad_", "detach_", "share_memory_", "rename_", "refine_names_"})
#: dunders that start like ``__iadd__`` but do not write
_NOT_INPLACE_DUNDER = frozenset({"__index__", "__int__", "__invert__", "__iter__"})


def _is_inplace_call(base: str, kwargs: dict) -> bool:
    if base.endswith("_") and not base.endswith("__"):
        return base not in _NOT_WRITING
    return (base.startswith("__i") and base not in _NOT_INPLACE_DUNDER) or base == "__setitem__" or "out" in kwargs


def _writes(name: str, kwargs: dict) -> bool:
    """Whether a call may write into its tensor arguments (conservatively: by its name, ``out=``
    and ``inplace=True``)."""
    return _is_inplace_call(name, kwargs) or kwargs.get("inplace") is True


def _destinations(args: tuple, kwargs: dict) -> list[Any]:
    """What a writing call writes: its first tensor (or tensor list) argument, and ``out=``."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
            break
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
            out.extend(a)
            break
    dst = kwargs.get("out")
    if isinstance(dst, torch.Tensor):
        out.append(dst)
    elif isinstance(dst, (list, tuple)):
        out.extend(x for x in dst if isinstance(x, torch.Tensor))
    return out


def _tensors_of(args: tuple, kwargs: dict) -> list[Any]:
    out: list[Any] = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _function_modes() -> list[Any]:
    """The torch-function-mode stack, bottom first."""
    try:
        from torch.overrides import _get_current_function_mode_stack

        return list(_get_current_function_mode_stack())
    except Exception:  # pragma: no cover - private API moved
        return []


def _is_device_context(mode: Any) -> bool:
    """torch's mode of ``torch.set_default_device`` (it must stay at the bottom of the stack)."""
    try:
        from torch.utils._device import DeviceContext
    except ImportError:  # pragma: no cover - torch without it
        return False
    return isinstance(mode, DeviceContext)


class ApiCaptureMode(TorchFunctionMode):
    """Records API calls into a :class:`CaptureSession` (levels ``api`` and ``mix``)."""

    def __init__(self, session: CaptureSession, record: bool = True, tag_only: bool = False) -> None:
        super().__init__()
        self.session = session
        self.tag_only = tag_only
        self._pending_bw: list[GradWatch] = []
        # This mode sees every Python-level write (in-place methods, out=, _foreach_*_, writes
        # through .data), and C++ writes bump version counters, so the session may reuse
        # measurements, except in distributed runs, where collectives (DDP's reducer) write
        # gradients from C++ without a version bump (session.api_reuse re-checks every step).
        if not tag_only:
            session.enable_api_reuse()
        self._off = False  # paused off the function-mode stack (between a scheduled dump's full steps)
        self._left: list[Any] = []  # the stack as the mode left it

    # -- the stack between full steps -----------------------------------------------------------
    def __enter__(self) -> "ApiCaptureMode":
        super().__enter__()
        self._off = False
        if not self.tag_only:
            self.session.follow_tier(self._follow_tier)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.session.unfollow_tier(self._follow_tier)
        if self._off:  # paused: already off the stack
            self._off = False
            return
        stack = _function_modes()
        if stack and stack[-1] is self:
            super().__exit__(*exc)
        else:  # under modes entered after it (and still active): from there
            take_out(self, stack, _pop_function_mode, _push_function_mode)

    def _follow_tier(self) -> None:
        """A step began: between full steps (light or unscheduled steps of a scheduled dump, a
        rank not selected) no call is recorded, so the mode leaves the function-mode stack when it
        is on top of it (every torch call then runs without it; else it stays, passing calls
        through). Writes and allocations made meanwhile are not seen, so what was remembered is
        forgotten when it leaves (``session.forget``). It goes back at the next full step: on top
        where the stack is as it left it, else under the modes the user entered meanwhile and is
        still inside (:func:`.mode_stacks.insert_back`), and always above torch's default-device
        mode, which stays at the bottom. Called through ``session.follow_tier``: never inside a
        backward pass, whose engine runs with a copy of the mode stacks."""
        s = self.session
        full = s.tier == "full"  # the schedule's decision, not a façade's pause (enabled_step)
        if not full and not self._off:
            stack = _function_modes()
            if stack and stack[-1] is self:
                s.forget()
                _pop_function_mode()
                self._off = True
                self._left = stack[:-1]
        elif full and self._off:
            self._off = False
            insert_back(self, _function_modes(), self._left, _pop_function_mode, _push_function_mode,
                        stays_below=_is_device_context)
            self._left = []
            s.enable_api_reuse()  # reuse again (single process), as when the mode was made

    # -- backward assembly --------------------------------------------------------------------
    def _emit_backward(self, watch: GradWatch) -> None:
        s = self.session
        name, op, module, module_class, fwd, cflags = watch.meta
        base = name.split(".")[1]
        if not s.wants(base, op, "backward", module):
            return
        rec = s.new_record(prefix=name.split(".")[0], base=base, op=op, level="api", phase="backward",
                           module=module, module_class=module_class, fwd=fwd,
                           name=name.rsplit(".", 1)[0] + ".backward", flags=dict(cflags) if cflags else None)
        if rec is None:
            return
        prev, s.busy = s.busy, True
        try:
            rec.tensors = s.describe(sorted(watch.grads_out, key=lambda kv: kv[0]), "input", rec.id, link=False)
            rec.tensors += s.describe(watch.summed_grads_in(), "output", rec.id, link=False)
            s.commit(rec)
        finally:
            s.busy = prev
        watch.grads_out.clear()
        watch.grads_in.clear()

    def flush_backward(self) -> None:
        """At a step boundary: emit backward records whose hooks did not all fire."""
        for w in self._pending_bw:
            if not w.done and w.has_data:
                w.finish()
        self._pending_bw = [w for w in self._pending_bw if not w.done]
        if len(self._pending_bw) > 100000:
            self._pending_bw.clear()

    def _call_unrecorded(self, func: Any, args: tuple, kwargs: dict, name: str, op: str, phase: str,
                         module: str, module_class: str | None) -> Any:
        s = self.session
        grad_inputs = []
        if s.options.backward and phase == "forward" and torch.is_grad_enabled() and not _is_inplace_call(name.split(".")[1], kwargs):
            grad_inputs = [(str(i), a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if not grad_inputs:
            return self._run(func, args, kwargs)
        s.busy = True
        try:
            seq0 = next_sequence_nr()
        finally:
            s.busy = False
        out = self._run(func, args, kwargs)
        s.busy = True
        try:
            watch = watch_call(grad_inputs, flat_outputs(out), seq0, self._emit_backward,
                               meta=(name, op, module, module_class, None, call_flags(args, kwargs)))
            if watch is not None:
                self._pending_bw.append(watch)
        finally:
            s.busy = False
        return out

    # -- interception ----------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        s = self.session
        if s.busy or tool_is_busy() or is_compiling():
            # is_compiling(): Dynamo is tracing a torch.compile'd function through this mode;
            # the graph gets the call alone, as without the tool (and is not recorded)
            return func(*args, **kwargs)
        return self._dispatch(func, args, kwargs)

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Call ``func``, then note what it wrote (statistics measured before are stale) and what
        it did to uninitialised memory: ``empty*`` results are marked, the destination of a write
        and fresh results are unmarked (see :meth:`.uninit.UninitStorages.after_call`). Cheap when
        the call writes nothing and no storage is marked: one name lookup."""
        s = self.session
        u = s.uninit
        name = getattr(func, "__name__", None) or ""
        writes = _writes(name, kwargs)
        factory = name in _UNINITIALIZED_RESULT
        if not (writes or factory or u):
            return func(*args, **kwargs)
        tensors = _tensors_of(args, kwargs)
        reuse = writes and s.reuse_stats
        held = u.held(tensors) if reuse else []
        out = func(*args, **kwargs)
        prev, s.busy = s.busy, True
        try:
            if reuse:
                # every tensor argument may have been written (by name we cannot tell which):
                # statistics are invalidated for all, but only the destination holds values now
                s.note_writes(tensors)
                u.restore(held)
            u.after_call(factory, [v for _, v in flat_outputs(out)],
                         written=_destinations(args, kwargs) if writes else (), inputs=tensors)
        finally:
            s.busy = prev
        return out

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        s = self.session
        if not s.enabled_step:
            return self._run(func, args, kwargs)
        try:
            info = _cached_classify(func)
        except TypeError:  # unhashable callable
            info = classify(func)
        if info is None:
            return self._run(func, args, kwargs)
        prefix, base, op = info
        phase = s.phase()
        module, module_class, fwd, _ = s.module_info()
        if self.tag_only or not s.wants(base, op, phase, module):
            out = self._run(func, args, kwargs)
            if phase in ("forward", "recompute") and torch.is_grad_enabled():
                tag_graph(out, {"module": module, "module_class": module_class, "fwd": None, "node": f"{prefix}.{base}"})
            return out
        cflags = call_flags(args, kwargs)  # autocast's compute dtype, None without autocast
        rec = s.new_record(prefix=prefix, base=base, op=op, level="api", phase=phase, module=module,
                           module_class=module_class, fwd=fwd, flags=dict(cflags) if cflags else None)
        if rec is None:  # filtered by op_range/skip: its backward still counts for the filters
            return self._call_unrecorded(func, args, kwargs, s.last_filtered_name, op, phase, module, module_class)
        flat = flat_args(args, kwargs)
        s.busy = True
        try:
            unmeasured: dict[str, str] = {}
            rec.tensors = s.describe(flat, "input", rec.id, link=True,
                                     no_values=_overwritten(flat) if base in _OVERWRITING else _NO_VALUE_OUT,
                                     unmeasured=unmeasured)
            grad_inputs = []
            if (s.options.backward and phase == "forward" and torch.is_grad_enabled()
                    and not _is_inplace_call(base, kwargs)):
                grad_inputs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
            seq0 = next_sequence_nr() if grad_inputs else None
        finally:
            s.busy = False
        if prefix == "Distributed":
            s.api_collective_depth += 1  # the aten-level c10d op inside is the same collective
            try:
                out = self._run(func, args, kwargs)
            finally:
                s.api_collective_depth -= 1
        else:
            out = self._run(func, args, kwargs)
        s.busy = True
        try:
            outs = flat_outputs(out)
            rec.tensors += s.describe(outs, "output", rec.id, link=False,
                                      no_values=_NO_VALUE_RESULT if base in _UNINITIALIZED_RESULT else {},
                                      unmeasured=unmeasured)
            if unmeasured:
                rec.flags["unmeasured"] = unmeasured
            s.note_outputs(rec.id, outs)
            s.commit(rec)
            if seq0 is not None:
                watch = watch_call([(str(i), a) for i, a in grad_inputs], outs, seq0, self._emit_backward,
                                   meta=(rec.name, op, module, module_class, rec.id, cflags))
                if watch is not None:
                    self._pending_bw.append(watch)
            if phase == "forward" and torch.is_grad_enabled():
                tag_graph(out, {"module": module, "module_class": module_class, "fwd": rec.id, "node": rec.name})
        finally:
            s.busy = False
        return out
