"""API-level capture: a TorchFunctionMode that records torch.*, torch.nn.functional.* and Tensor
method calls as the user wrote them (``Functional.linear.3.forward``).

Only the outermost call is recorded (inside a handler the mode is off, so ``F.linear`` calling
other torch functions is one record). Calls that return no tensor (``size()``, ``dim()``) and
attribute access are passed through untouched.

Backward: for an out-of-place call whose inputs require grad, each such input is passed to the
op as a zero-cost alias (``x.view_as(x)``) with a gradient hook, and each output gets a gradient
hook, so the op's backward record holds exactly this op's gradients (its true VJP: grad outputs as
inputs, grad inputs as outputs), not the total gradient of a tensor used in several places.
Aliasing changes no value: the model's results stay bitwise identical.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..records import OpRecord
from .module_tracker import tag_graph
from .session import CaptureSession, flat_args, flat_outputs

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
    if name is None or name in _PASSTHROUGH:
        return None
    module = getattr(func, "__module__", None) or ""
    objclass = getattr(func, "__objclass__", None)
    qual = getattr(func, "__qualname__", "") or ""
    if objclass is not None and objclass.__name__ in ("TensorBase", "Tensor") or qual.startswith(("TensorBase.", "Tensor.")):
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


@functools.lru_cache(maxsize=4096)
def _cached_classify(func: Any) -> tuple[str, str, str] | None:
    return classify(func)


def _is_inplace_call(base: str, kwargs: dict) -> bool:
    return (base.endswith("_") and not base.endswith("__")) or base.startswith("__i") or base == "__setitem__" or "out" in kwargs


class _PendingBackward:
    __slots__ = ("name", "op", "module", "module_class", "fwd", "grads_out", "grads_in", "n_in", "done")

    def __init__(self, name: str, op: str, module: str, module_class: str | None, fwd: int, n_in: int) -> None:
        self.name, self.op, self.module, self.module_class, self.fwd = name, op, module, module_class, fwd
        self.grads_out: list[tuple[str, torch.Tensor]] = []
        self.grads_in: list[tuple[str, torch.Tensor]] = []
        self.n_in = n_in
        self.done = False


class ApiCaptureMode(TorchFunctionMode):
    """Records API calls into a :class:`CaptureSession` (levels ``api`` and ``mix``)."""

    def __init__(self, session: CaptureSession, record: bool = True, tag_only: bool = False) -> None:
        super().__init__()
        self.session = session
        self.tag_only = tag_only
        self._pending_bw: list[_PendingBackward] = []

    # -- backward assembly --------------------------------------------------------------------
    def _grad_out_hook(self, pb: _PendingBackward, arg: str, grad: torch.Tensor) -> None:
        pb.grads_out.append((arg, grad))

    def _grad_in_hook(self, pb: _PendingBackward, arg: str, grad: torch.Tensor) -> None:
        pb.grads_in.append((arg, grad))
        if len(pb.grads_in) >= pb.n_in:
            self._emit_backward(pb)

    def _emit_backward(self, pb: _PendingBackward) -> None:
        if pb.done:
            return
        pb.done = True
        s = self.session
        if not s.wants(pb.name.split(".")[1], pb.name, "backward", pb.module):
            return
        prefix, base = pb.name.split(".")[0], pb.name.split(".")[1]
        rec = s.new_record(prefix=prefix, base=base, op=pb.name, level="api", phase="backward",
                           module=pb.module, module_class=pb.module_class, fwd=pb.fwd,
                           name=pb.name.rsplit(".", 1)[0] + ".backward")
        if rec is None:
            return
        rec.op = pb.op
        prev, s.busy = s.busy, True
        try:
            rec.tensors = s.describe(sorted(pb.grads_out), "input", rec.id, link=False)
            rec.tensors += s.describe(sorted(pb.grads_in), "output", rec.id, link=False)
            s.commit(rec)
        finally:
            s.busy = prev
        pb.grads_out.clear()
        pb.grads_in.clear()

    def flush_backward(self) -> None:
        """At a step boundary: emit backward records whose hooks did not all fire."""
        for pb in self._pending_bw:
            if not pb.done and (pb.grads_in or pb.grads_out):
                self._emit_backward(pb)
        self._pending_bw = [pb for pb in self._pending_bw if not pb.done]
        if len(self._pending_bw) > 100000:
            self._pending_bw.clear()

    # -- interception ----------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        s = self.session
        if s.busy or not s.enabled_step:
            return func(*args, **kwargs)
        try:
            info = _cached_classify(func)
        except TypeError:  # unhashable callable
            info = classify(func)
        if info is None:
            return func(*args, **kwargs)
        prefix, base, op = info
        phase = s.phase()
        module, module_class, fwd, _ = s.module_info()
        if self.tag_only or not s.wants(base, op, phase, module):
            out = func(*args, **kwargs)
            if phase in ("forward", "recompute") and torch.is_grad_enabled():
                tag_graph(out, {"module": module, "module_class": module_class, "fwd": None, "node": f"{prefix}.{base}"})
            return out
        rec = s.new_record(prefix=prefix, base=base, op=op, level="api", phase=phase, module=module,
                           module_class=module_class, fwd=fwd)
        if rec is None:
            return func(*args, **kwargs)
        flat = flat_args(args, kwargs)
        s.busy = True
        try:
            rec.tensors = s.describe(flat, "input", rec.id, link=True)
            grad_inputs = []
            if (s.options.backward and phase == "forward" and torch.is_grad_enabled()
                    and not _is_inplace_call(base, kwargs)):
                grad_inputs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
            pb = None
            if grad_inputs:
                pb = _PendingBackward(rec.name, op, module, module_class, rec.id, len(grad_inputs))
                args = list(args)
                for i, a in grad_inputs:
                    alias = a.view_as(a)
                    alias.register_hook(functools.partial(self._grad_in_hook, pb, str(i)))
                    args[i] = alias
                args = tuple(args)
        finally:
            s.busy = False
        out = func(*args, **kwargs)
        s.busy = True
        try:
            outs = flat_outputs(out)
            rec.tensors += s.describe(outs, "output", rec.id, link=False)
            s.note_outputs(rec.id, outs)
            s.commit(rec)
            if pb is not None:
                n_hooked = 0
                for arg, v in outs:
                    if isinstance(v, torch.Tensor) and v.requires_grad and v.grad_fn is not None:
                        v.register_hook(functools.partial(self._grad_out_hook, pb, arg))
                        n_hooked += 1
                if n_hooked:
                    self._pending_bw.append(pb)
            if phase == "forward" and torch.is_grad_enabled():
                tag_graph(out, {"module": module, "module_class": module_class, "fwd": rec.id, "node": rec.name})
        finally:
            s.busy = False
        return out
