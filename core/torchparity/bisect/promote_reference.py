"""Promotion to the reference backend: the promoted ops of a bisect's target run are computed on
the reference backend's device (the CPU reference: ``--promote-backend cpu``) instead of the
device's own kernels.

Precision promotion (:mod:`.promote`) answers "would this op be right in higher precision?"; this
answers "would this op be right on the reference backend, in the same dtype?": a device kernel
that computes wrongly (a vendor kernel bug, a fault) is removed by it, a rounding problem of the
dtype is not. :class:`ReferenceDevice` copies a promoted op's tensors to the reference device
(dtypes kept), runs the op there, copies what it returns back to the op's device, and writes
in-place / ``out=`` results back into the caller's tensors. It sits just outside the device layer
(:data:`LAYER_DEVICE` - 1), so a promoted op never reaches a device-layer consumer (the emulated
device, a fault) attached after it; ops the predicate rejects run untouched.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from ..capture.op_stream import LAYER_DEVICE, OpCall, OpConsumer, op_stream
from ..errors import UsageError


class ReferenceDevice(OpConsumer):
    """Run the ops ``promote`` accepts on ``device`` (the reference backend's), dtypes kept."""

    layer = LAYER_DEVICE - 1
    needs_modules = True

    def __init__(self, promote: Callable[[OpCall], bool], device: Any) -> None:
        self.promote = promote
        self.device = device

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        from ..online.reference import cast_copy, written_args

        info = call.info
        if info.view or info.random or info.collective or info.namespace == "profiler" or not self.promote(call):
            return run(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not flat or any(t.layout != torch.strided for t in flat):
            return run(*args, **kwargs)
        home = flat[0].device
        ref_args, ref_kwargs = cast_copy((args, kwargs), lambda d: d, self.device)
        try:
            out = info.func(*ref_args, **ref_kwargs)
        except (RuntimeError, NotImplementedError, TypeError):  # the reference cannot run it: the device does
            return run(*args, **kwargs)
        back: dict[int, torch.Tensor] = {}
        for mine, theirs in zip(written_args(info.func, args, kwargs), written_args(info.func, ref_args, ref_kwargs)):
            mine.copy_(theirs)  # in-place / out=: the caller's tensor holds the reference's result
            back[id(theirs)] = mine

        def home_of(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                hit = back.get(id(x))
                return hit if hit is not None else x.to(home)
            return x

        return tree_map(home_of, out)


def reference_device(backend: str) -> Any:
    """The torch device of the installed, available, non-emulated backend ``backend``."""
    from ..plugins import get_registry

    backends = get_registry().backends
    b = backends.get(backend)
    if b is None:
        raise UsageError(f"bisect: unknown promote backend {backend!r}; installed: {', '.join(sorted(backends))}")
    if getattr(b, "is_emulation", False):
        raise UsageError(f"bisect: promote backend {backend!r} is an emulation, not a reference; use cpu")
    avail = b.is_available()
    if not avail:
        raise UsageError(f"bisect: promote backend {backend!r} is not available here ({avail.reason})")
    return b.device()


def on_reference(promote: Callable[[OpCall], bool], device: Any) -> ContextManager[Any]:
    """While in the block, the ops ``promote`` accepts run on ``device``."""
    return op_stream().attached(ReferenceDevice(promote, device))
