"""The emulated device: a device-layer consumer of the op stream that changes how ops compute on
the CPU.

This is an **emulation** for tests, demos and validating torchparity itself, not a device:

* reduced precision (``dtype="bfloat16"`` or ``"float16"``): every floating op rounds its wider
  floating tensor inputs (float32/float64) to ``dtype``, computes in ``dtype`` and casts its
  outputs back, so tensors keep their dtype while their values are those of a 16-bit device.
  In-place and ``out=`` ops write the rounded result back into the caller's tensors.
* fault injection: :class:`~.faults.Fault` specs perturb, or put NaN/Inf into, the output of chosen
  ops (op pattern, module path pattern, phase, step, call index).

It hangs on :func:`torchparity.op_stream` at :data:`~torchparity.capture.op_stream.LAYER_DEVICE`,
the innermost place of the chain, whatever the order in which it and the tool's observers (the
dump, the NaN/Inf screen, online compare) were entered: they always see what the emulated device
computed. Call indices, phases and modules are the stream's (:class:`~torchparity.capture.op_stream.
OpCall`), which name ops exactly like the dump's aten records (per op and phase within a step,
views included, ``detach``-like bookkeeping ops excluded), so ``Fault(op="aten.mm",
phase="forward", call=3)`` corrupts the record ``Aten.mm.3.forward``. Steps advance on
``optimizer.step()`` (the first optimizer that steps) or by hand with
:meth:`EmulatedDeviceMode.next_step` (which ends the stream's step).

torchparity's own computations (dump statistics, reference ops) never reach it: the stream hands
its consumers only the model's ops (see :func:`torchparity.capture.tool_state.tool_is_busy`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torchparity.capture.op_stream import LAYER_DEVICE, OpCall, OpConsumer, OpInfo, op_stream
from torchparity.errors import PluginError

from .faults import Fault, Injection

log = logging.getLogger("torchparity")

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
#: dtypes that are rounded to the emulated dtype (narrower ones are left as they are)
_WIDE = (torch.float32, torch.float64)
#: ops that move or convert data rather than compute: never rounded (a conversion to bf16 must stay
#: bf16, a copy must stay exact)
_DATA_MOVEMENT = frozenset({
    "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "clone", "to", "lift_fresh_copy",
    "detach_copy", "alias_copy", "_local_scalar_dense", "set_", "resize_", "resize_as_", "empty_like",
    "new_empty", "new_empty_strided", "empty", "empty_strided", "zeros_like", "ones_like", "full_like",
    "fill_", "zero_", "_to_dense", "contiguous", "_foreach_copy_", "_unsafe_view",
})


def resolve_dtype(dtype: Any) -> torch.dtype | None:
    """``"bfloat16"``/``"bf16"``/``torch.bfloat16``/``"float16"``/``"fp16"``/``None`` -> torch dtype."""
    if dtype is None or dtype in ("", "none", "None", "float32", "fp32"):
        return None
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.bfloat16, torch.float16):
            return dtype
        if dtype == torch.float32:
            return None
    elif isinstance(dtype, str) and dtype.replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.replace("torch.", "")]
    raise PluginError(f"emulated device: dtype must be bfloat16, float16 or null, got {dtype!r}")


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


class EmulatedDeviceMode(OpConsumer):
    """Reduced-precision compute and fault injection on the CPU (an emulation, see module doc).

    A device-layer consumer of the op stream: ``with mode:`` attaches it for the block, and it
    computes every op that reaches the end of the chain, after every observer.

    Attributes:
        dtype: the emulated compute dtype (``None``: full precision).
        faults: the planted faults.
        step: the current step (0-based, counted from this mode's entry).
        injections: every fault that fired, in order (what tests and demos assert on).
    """

    #: read by the dump header, online compare and the NaN tracker to know that a consumer of the
    #: stream computes ops as a device would (and in what precision)
    torchparity_emulated = True
    layer = LAYER_DEVICE

    def __init__(self, dtype: Any = None, faults: Iterable[Fault | dict] = (),
                 promote: Callable[[OpCall], bool] | None = None) -> None:
        self.dtype = resolve_dtype(dtype)
        self.faults: list[Fault] = [Fault.from_mapping(f) for f in (faults or ())]
        #: ops for which this returns True are computed at full precision (not rounded): the
        #: per-op/per-module exclusion that ``torchparity.bisect`` promotes with
        self.promote = promote
        self.step = 0
        self.injections: list[Injection] = []
        # faults and promotions name ops by module: only then does the stream track modules
        self.needs_modules = bool(self.faults) or promote is not None
        self._emulate: dict[int, bool] = {}  # id(overload) -> computed in the emulated dtype
        #: ops whose kernel refused all-rounded inputs: computed at full precision, result rounded
        self.rounded_outputs_only: set[str] = set()

    # ---- public ---------------------------------------------------------------------------
    @property
    def emulated_dtype(self) -> torch.dtype | None:
        return self.dtype

    def next_step(self) -> None:
        """End the current step by hand (steps also end on ``optimizer.step()``): it ends the op
        stream's step, so call indices start again from 0 for every consumer."""
        if self in op_stream().consumers:
            op_stream().next_step()  # calls on_step_end
        else:
            self.step += 1

    # ``step`` is the counter; keep a method name that reads well in user code
    advance_step = next_step

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedDeviceMode":
        op_stream().attach(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        op_stream().detach(self)

    def on_step_end(self, step: int) -> None:
        self.step += 1

    # ---- dispatch -------------------------------------------------------------------------
    def _emulates(self, info: OpInfo) -> bool:
        """Is this overload computed in the emulated dtype? (not views, random, collectives,
        data movement)"""
        e = self._emulate.get(id(info.func))
        if e is None:
            e = self._emulate[id(info.func)] = not (info.view or info.random or info.collective
                                                    or info.base in _DATA_MOVEMENT or info.namespace == "profiler")
        return e

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        # the stream never hands over the tool's own ops (tool_is_busy): they run untouched
        info = call.info
        if self.dtype is not None and self._emulates(info) and not (self.promote is not None
                                                                   and self.promote(call)):
            out = self._reduced(run, info.func, args, kwargs)
        else:
            out = run(*args, **kwargs)
        if self.faults and info.counted:
            # the stream's name of the op (its counter per (prefix, base, phase) within the step)
            # is the dump's, so call=3 is the record Aten.<op>.3.<phase>
            self._inject(call, out)
        return out

    # ---- reduced precision ----------------------------------------------------------------
    def _reduced(self, run: Callable[..., Any], func: Any, args: tuple, kwargs: dict) -> Any:
        target = self.dtype
        flat, _ = tree_flatten((args, kwargs))
        wide = None
        for t in flat:
            if isinstance(t, torch.Tensor):
                if t.layout != torch.strided or t.is_complex() or t.device.type == "meta":
                    return run(*args, **kwargs)
                if t.dtype in _WIDE and (wide is None or t.dtype == torch.float64):
                    wide = t.dtype
        if wide is None:  # nothing to round: integer ops, already-16-bit tensors
            return run(*args, **kwargs)
        converted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(orig) -> (orig, rounded)

        def down(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in _WIDE:
                hit = converted.get(id(x))
                if hit is None:
                    hit = (x, x.to(target))
                    converted[id(x)] = hit
                return hit[1]
            return x

        cargs, ckwargs = tree_map(down, (args, kwargs))
        try:
            out = run(*cargs, **ckwargs)
        except (RuntimeError, NotImplementedError):
            # Kernels with mixed-dtype contracts (e.g. SDPA backward wants a float32 logsumexp
            # next to half inputs) refuse all-rounded inputs: compute at full precision and round
            # the result instead, and remember the op so it can be reported.
            self.rounded_outputs_only.add(str(func))
            out = run(*args, **kwargs)
            arg_ids = {id(t) for t in flat if isinstance(t, torch.Tensor)}

            def round_result(x: Any) -> Any:
                if not (isinstance(x, torch.Tensor) and x.dtype in _WIDE):
                    return x
                if id(x) in arg_ids:  # in-place / out=: round where it lives
                    return x.copy_(x.to(target))
                return x.to(target).to(x.dtype)

            return tree_map(round_result, out)
        # write back what the op mutated (in-place, out=, foreach_, running stats ...)
        by_rounded = {id(r): o for o, r in converted.values()}
        for orig_id in _written_ids(func, args, kwargs):
            hit = converted.get(orig_id)
            if hit is not None:
                hit[0].copy_(hit[1])

        def up(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                orig = by_rounded.get(id(x))
                if orig is not None:  # the op returned (an alias of) its mutated argument
                    return orig
                if x.dtype == target:
                    return x.to(wide)
            return x

        return tree_map(up, out)

    # ---- faults ---------------------------------------------------------------------------
    def _inject(self, call: OpCall, out: Any) -> None:
        info = call.info
        func, base, index = info.func, info.base, call.index
        phase = module = qualified = None
        for i, f in enumerate(self.faults):
            if f.call is not None and f.call != index:
                continue
            if qualified is None:
                phase, qualified = call.phase, f"{info.namespace}.{base}"
                module = call.module
            if not f.matches_op(base, qualified, info.op) or not f.matches_where(module, phase, self.step):
                continue
            tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if f.output >= len(tensors):
                continue
            t = tensors[f.output]
            if not t.is_floating_point() or t.numel() == 0:
                continue
            detail = _corrupt(t, f)
            inj = Injection(fault=i, op=info.op, module=module, phase=phase, step=self.step, call=index,
                            kind=f.kind, detail=detail)
            self.injections.append(inj)
            log.info("emulated device: injected %s into %s (module %r, step %d)", f.kind, call.name, module,
                     self.step)


def _written_ids(func: Any, args: Sequence[Any], kwargs: dict) -> set[int]:
    """ids of the tensors an op writes to, from its schema's alias annotations."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return set()
    ids: set[int] = set()
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        if i < len(args) and not a.kwarg_only:
            v = args[i]
        else:
            v = kwargs.get(a.name)
        for t in tree_flatten(v)[0]:
            if isinstance(t, torch.Tensor):
                ids.add(id(t))
    return ids


def _corrupt(t: torch.Tensor, f: Fault) -> dict[str, Any]:
    """Apply fault ``f`` to tensor ``t`` in place; returns what was done."""
    with torch.no_grad():
        target = t
        if f.index is not None:
            if f.index >= t.numel():
                return {"skipped": f"index {f.index} out of range for {t.numel()} elements"}
            rest, where = f.index, []
            for size in reversed(t.shape):
                rest, i = divmod(rest, size)
                where.append(i)
            target = t[tuple(reversed(where))] if where else t
        if f.kind == "scale":
            target.mul_(f.factor)
        elif f.kind == "add":
            target.add_(f.value)
        elif f.kind == "nan":
            target.fill_(float("nan"))
        else:
            target.fill_(float("inf"))
    return {"index": f.index, "factor": f.factor if f.kind == "scale" else None,
            "value": f.value if f.kind == "add" else None}


class emulate:
    """``with emulate(dtype="bfloat16", faults=[Fault(...)]) as dev: train(...)`` — run on the
    emulated device (CPU emulation, not hardware). ``dev.injections`` lists the faults that fired.

    Args:
        dtype: ``"bfloat16"``, ``"float16"`` or ``None`` (full precision, faults only).
        faults: :class:`Fault` objects or mappings with the same keys.
        promote: optional predicate on the op stream's :class:`OpCall`; the ops it accepts are
            computed at full precision instead of ``dtype`` (what ``torchparity.bisect`` uses).
    """

    def __init__(self, dtype: Any = None, faults: Iterable[Fault | dict] = (),
                 promote: Callable[[OpCall], bool] | None = None) -> None:
        self.mode = EmulatedDeviceMode(dtype, faults, promote)

    def __enter__(self) -> EmulatedDeviceMode:
        return self.mode.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.mode.__exit__(*exc)


def active_emulation() -> EmulatedDeviceMode | None:
    """The active :class:`EmulatedDeviceMode` (the last one attached to the op stream), if any."""
    for c in reversed(op_stream().consumers):
        if isinstance(c, EmulatedDeviceMode):
            return c
    return None
