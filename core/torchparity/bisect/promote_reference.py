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
from .op_keys import describe_op, op_key


class ReferenceDevice(OpConsumer):
    """Run the ops ``promote`` accepts on ``device`` (the reference backend's), dtypes kept."""

    layer = LAYER_DEVICE - 1
    needs_modules = True

    def __init__(self, promote: Callable[[OpCall], bool], device: Any,
                 not_promoted: dict[str, int] | None = None) -> None:
        self.promote = promote
        self.device = device
        #: ops the predicate chose that ran on the device after all (the reference could not run
        #: them, or not a strided tensor): record name -> calls; the report lists them
        self.not_promoted = not_promoted if not_promoted is not None else {}

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        from ..online.reference import cast_copy, written_args

        info = call.info
        if info.view or info.random or info.collective or info.namespace == "profiler" or not self.promote(call):
            return run(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not flat:
            return run(*args, **kwargs)
        if any(t.layout != torch.strided for t in flat):
            return self._unpromoted(call, run, args, kwargs)
        home = flat[0].device
        try:  # everything that can fail before the caller's tensors are written
            ref_args, ref_kwargs = cast_copy((args, kwargs), lambda d: d, self.device)
            out = info.func(*ref_args, **ref_kwargs)
            written = list(zip(written_args(info.func, args, kwargs), written_args(info.func, ref_args, ref_kwargs)))
            back = {id(theirs): mine for mine, theirs in written}
            homed = [theirs.to(home) for _, theirs in written]
            result = tree_map(lambda x: (back.get(id(x)) or x.to(home)) if isinstance(x, torch.Tensor) else x, out)
        except (RuntimeError, NotImplementedError, TypeError):  # the reference cannot run it
            return self._unpromoted(call, run, args, kwargs)
        for (mine, _), h in zip(written, homed):  # in-place / out=: the caller's tensor holds the result
            mine.copy_(h)
        return result

    def _unpromoted(self, call: OpCall, run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run the op on the device as without promotion, and say so in :attr:`not_promoted`."""
        name = describe_op(op_key(call))
        self.not_promoted[name] = self.not_promoted.get(name, 0) + 1
        return run(*args, **kwargs)


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


def on_reference(promote: Callable[[OpCall], bool], device: Any,
                 not_promoted: dict[str, int] | None = None) -> ContextManager[Any]:
    """While in the block, the ops ``promote`` accepts run on ``device``."""
    return op_stream().attached(ReferenceDevice(promote, device, not_promoted))
