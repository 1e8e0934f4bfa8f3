"""How a bisect promotes a set of modules or ops: device-layer consumers of the op stream.

* ``emulated`` targets (``emulated:bfloat16``, ``emulated:float16``): the emulated device's own
  per-op exclusion (``emulate(dtype, promote=predicate)``): a promoted op is computed at the
  model's precision (float32/float64) instead of being rounded to the 16-bit dtype; every other
  op is rounded exactly as without the bisect.
* ``native`` targets (the user's model runs in bf16/fp16 itself, e.g. ``model.to(torch.bfloat16)``
  or autocast): :class:`UpcastDevice`, which computes a promoted op with its 16-bit floating inputs
  cast up to float32 (or float64) and casts its floating outputs back to their dtype (in-place and
  ``out=`` ops write the result back into the caller's tensors), so tensors keep their dtypes.

Both sit at :data:`~torchparity.capture.op_stream.LAYER_DEVICE` and decide per op with a predicate
on the stream's :class:`~torchparity.capture.op_stream.OpCall` (module path, op, phase). Ops the
predicate rejects run untouched: the user's numerics change only inside the promoted set.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

from ..capture.op_stream import LAYER_DEVICE, OpCall, OpConsumer, op_stream
from .op_keys import OpKey, Predicate, describe_op, op_key

__all__ = ["OpKey", "Predicate", "UpcastDevice", "describe_op", "op_key", "target_context"]

class UpcastDevice(OpConsumer):
    """Compute the ops a predicate accepts with their bf16/fp16 inputs cast up, results cast back."""

    layer = LAYER_DEVICE
    needs_modules = True

    def __init__(self, promote: Predicate, dtype: Any = None, not_promoted: dict[str, int] | None = None) -> None:
        import torch

        self.promote = promote
        self.dtype = dtype or torch.float32
        self._low = (torch.bfloat16, torch.float16)
        #: ops the predicate chose whose kernel refused the upcast inputs (record name -> calls):
        #: they ran as without promotion, and the report lists them
        self.not_promoted = not_promoted if not_promoted is not None else {}

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        from ..online.reference import written_args

        info = call.info
        if info.view or info.random or info.collective or info.namespace == "profiler":
            return run(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not any(t.dtype in self._low for t in flat) or any(t.layout != torch.strided for t in flat):
            return run(*args, **kwargs)
        if not self.promote(call):
            return run(*args, **kwargs)
        up: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def cast_up(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in self._low:
                hit = up.get(id(x))
                if hit is None:
                    hit = up[id(x)] = (x, x.to(self.dtype))
                return hit[1]
            return x

        low = next(t.dtype for t in flat if t.dtype in self._low)
        cargs, ckwargs = tree_map(cast_up, (args, kwargs))
        try:
            out = run(*cargs, **ckwargs)
        except (RuntimeError, NotImplementedError):  # a kernel with a mixed-dtype contract
            name = describe_op(op_key(call))
            self.not_promoted[name] = self.not_promoted.get(name, 0) + 1
            return run(*args, **kwargs)
        by_up = {id(u): o for o, u in up.values()}
        for t in written_args(info.func, args, kwargs):  # in-place / out=: write back into the caller's
            hit = up.get(id(t))
            if hit is not None:
                hit[0].copy_(hit[1])

        def cast_back(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                orig = by_up.get(id(x))
                if orig is not None:
                    return orig
                if x.dtype == self.dtype:
                    return x.to(low)
            return x

        return tree_map(cast_back, out)


def _upcast(promote: Predicate, dtype: Any, not_promoted: dict[str, int] | None = None) -> ContextManager[Any]:
    return op_stream().attached(UpcastDevice(promote, dtype, not_promoted))


def target_context(target: str, promote: Predicate, promote_dtype: Any = None,
                   promote_device: Any = None, not_promoted: dict[str, int] | None = None) -> ContextManager[Any]:
    """The context a target run executes in, with ``promote`` deciding which ops are promoted: to
    a higher precision, or, with ``promote_device``, onto the reference backend's device
    (:mod:`.promote_reference`: the promoted ops bypass every device-layer consumer). Chosen ops
    that ran unpromoted after all are counted in ``not_promoted`` (the emulated device's own
    promotion has no such case)."""
    kind, _, dtype = target.partition(":")
    if promote_device is not None:
        from .promote_reference import on_reference

        stack = contextlib.ExitStack()
        stack.enter_context(on_reference(promote, promote_device, not_promoted))
        if kind == "emulated":
            from torchparity_backend_emulated import emulate

            stack.enter_context(emulate(dtype=dtype or "bfloat16"))
        return stack
    if kind == "emulated":
        from torchparity_backend_emulated import emulate

        return emulate(dtype=dtype or "bfloat16", promote=promote)
    return _upcast(promote, promote_dtype, not_promoted)
