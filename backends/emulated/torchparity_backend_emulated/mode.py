"""The emulated device: a TorchDispatchMode that changes how ops compute on the CPU.

This is an **emulation** for tests, demos and validating torchparity itself, not a device:

* reduced precision (``dtype="bfloat16"`` or ``"float16"``): every floating op rounds its wider
  floating tensor inputs (float32/float64) to ``dtype``, computes in ``dtype`` and casts its
  outputs back, so tensors keep their dtype while their values are those of a 16-bit device.
  In-place and ``out=`` ops write the rounded result back into the caller's tensors.
* fault injection: :class:`~.faults.Fault` specs perturb, or put NaN/Inf into, the output of chosen
  ops (op pattern, module path pattern, phase, step, call index).

Call indices count exactly like the dump's aten records (per op and phase within a step, views
included, ``detach``-like bookkeeping ops excluded), so ``Fault(op="aten.mm", phase="forward",
call=3)`` corrupts the record ``Aten.mm.3.forward``. Steps advance on ``optimizer.step()`` (the
first optimizer that steps) or by hand with :meth:`EmulatedDeviceMode.step`.

torchparity's own computations (dump statistics, reference ops) run while
:func:`torchparity.capture.session.tool_is_busy` is true: they pass through untouched and
uncounted. Enter this mode *outside* torchparity's capture/compare modes (``dump(backend=
"emulated")`` and ``CompareWithReference(backend="emulated")`` do that for you) so that they see
what the emulated device computed.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.capture import ops as opinfo
from torchparity.capture.aten_mode import _SKIP as _UNCOUNTED
from torchparity.capture.module_tracker import Frame, ModuleTracker, in_backward, tag_graph
from torchparity.capture.session import tool_is_busy
from torchparity.errors import PluginError

from .faults import Fault, Injection

log = logging.getLogger("torchparity")

#: ``grad_fn.metadata`` key for backward attribution (separate from the dump's own key, so the
#: dump's tags are never pre-empted by ours).
_META_KEY = "torchparity.emulated"

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


class EmulatedDeviceMode(TorchDispatchMode):
    """Reduced-precision compute and fault injection on the CPU (an emulation, see module doc).

    Attributes:
        dtype: the emulated compute dtype (``None``: full precision).
        faults: the planted faults.
        step: the current step (0-based).
        injections: every fault that fired, in order (what tests and demos assert on).
    """

    #: read by online compare to know what precision the "device" computes in
    torchparity_emulated = True

    def __init__(self, dtype: Any = None, faults: Iterable[Fault | dict] = ()) -> None:
        super().__init__()
        self.dtype = resolve_dtype(dtype)
        self.faults: list[Fault] = [Fault.from_mapping(f) for f in (faults or ())]
        self.step = 0
        self.injections: list[Injection] = []
        self._counters: dict[tuple[str, str, str], int] = {}
        self._in_optimizer = False
        self._first_optimizer: int | None = None
        self._hooks: list[Any] = []
        self._tracker: ModuleTracker | None = None
        self._info: dict[Any, tuple[str, str, str, bool, bool]] = {}
        #: ops whose kernel refused all-rounded inputs: computed at full precision, result rounded
        self.rounded_outputs_only: set[str] = set()

    # ---- public ---------------------------------------------------------------------------
    @property
    def emulated_dtype(self) -> torch.dtype | None:
        return self.dtype

    def next_step(self) -> None:
        """End the current step by hand (steps also end on ``optimizer.step()``)."""
        self.step += 1
        self._counters.clear()
        if self._tracker is not None:
            self._tracker.new_step()

    # ``step`` is the counter; keep a method name that reads well in user code
    advance_step = next_step

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedDeviceMode":
        import torch.optim.optimizer as optim_mod

        self._hooks = [
            optim_mod.register_optimizer_step_pre_hook(self._on_opt_pre),
            optim_mod.register_optimizer_step_post_hook(self._on_opt_post),
        ]
        if self.faults:
            self._tracker = ModuleTracker()
            self._tracker.on_exit.append(self._tag_backward)
            self._tracker.start()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if self._tracker is not None:
                self._tracker.stop()
                self._tracker = None

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = True

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = False
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        if id(optimizer) == self._first_optimizer:  # several optimizers: one step per iteration
            self.next_step()

    # ---- module attribution ---------------------------------------------------------------
    def _tag_backward(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        """Tag the autograd nodes this module created with its path (innermost module wins)."""
        tag_graph(output, frame.path, key=_META_KEY)

    def _where(self) -> tuple[str, str]:
        """(phase, module path) of the running op, as the dump would name them."""
        tracker = self._tracker
        if self._in_optimizer:
            frame = tracker.current() if tracker is not None else None
            return "optimizer", frame.path if frame is not None else ""
        if in_backward():
            frame = tracker.current() if tracker is not None else None
            if frame is not None and frame.recompute:
                return "recompute", frame.path
            try:
                node = torch._C._current_autograd_node()
                module = node.metadata.get(_META_KEY, "") if node is not None else ""
            except (AttributeError, RuntimeError):
                module = ""
            return "backward", module
        frame = tracker.current() if tracker is not None else None
        return "forward", frame.path if frame is not None else ""

    # ---- dispatch -------------------------------------------------------------------------
    def _op_info(self, func: Any) -> tuple[str, str, str, bool, bool]:
        """(base name, ``ns.base``, record prefix, uncounted by the dump, to be rounded)."""
        info = self._info.get(func)
        if info is None:
            base = opinfo.base_name(func)
            ns = opinfo.namespace(func)
            prefix = "Distributed" if opinfo.is_collective(func) else "Aten"
            uncounted = base in _UNCOUNTED or ns == "profiler"
            emulate = not (opinfo.is_view(func) or opinfo.is_random(func) or opinfo.is_collective(func)
                           or base in _DATA_MOVEMENT or ns == "profiler")
            info = (base, f"{ns}.{base}", prefix, uncounted, emulate)
            self._info[func] = info
        return info

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if tool_is_busy():
            return func(*args, **kwargs)
        base, qualified, prefix, uncounted, emulate = self._op_info(func)
        if self.dtype is not None and emulate:
            out = self._reduced(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if self.faults and not uncounted:
            phase, module = self._where()
            key = (prefix, base, phase)
            call = self._counters.get(key, 0)
            self._counters[key] = call + 1
            self._inject(func, prefix, base, qualified, phase, module, call, out)
        return out

    # ---- reduced precision ----------------------------------------------------------------
    def _reduced(self, func: Any, args: tuple, kwargs: dict) -> Any:
        target = self.dtype
        flat, _ = tree_flatten((args, kwargs))
        wide = None
        for t in flat:
            if isinstance(t, torch.Tensor):
                if t.layout != torch.strided or t.is_complex() or t.device.type == "meta":
                    return func(*args, **kwargs)
                if t.dtype in _WIDE and (wide is None or t.dtype == torch.float64):
                    wide = t.dtype
        if wide is None:  # nothing to round: integer ops, already-16-bit tensors
            return func(*args, **kwargs)
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
            out = func(*cargs, **ckwargs)
        except (RuntimeError, NotImplementedError):
            # Kernels with mixed-dtype contracts (e.g. SDPA backward wants a float32 logsumexp
            # next to half inputs) refuse all-rounded inputs: compute at full precision and round
            # the result instead, and remember the op so it can be reported.
            self.rounded_outputs_only.add(str(func))
            out = func(*args, **kwargs)
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
    def _inject(self, func: Any, prefix: str, base: str, qualified: str, phase: str, module: str, call: int, out: Any) -> None:
        for i, f in enumerate(self.faults):
            if f.call is not None and f.call != call:
                continue
            if not f.matches_op(base, qualified, str(func)) or not f.matches_where(module, phase, self.step):
                continue
            tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if f.output >= len(tensors):
                continue
            t = tensors[f.output]
            if not t.is_floating_point() or t.numel() == 0:
                continue
            detail = _corrupt(t, f)
            inj = Injection(fault=i, op=str(func), module=module, phase=phase, step=self.step, call=call,
                            kind=f.kind, detail=detail)
            self.injections.append(inj)
            log.info("emulated device: injected %s into %s.%s.%d.%s (module %r, step %d)", f.kind,
                     prefix, base, call, phase, module, self.step)


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
    """

    def __init__(self, dtype: Any = None, faults: Iterable[Fault | dict] = ()) -> None:
        self.mode = EmulatedDeviceMode(dtype, faults)

    def __enter__(self) -> EmulatedDeviceMode:
        return self.mode.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.mode.__exit__(*exc)


def active_emulation() -> EmulatedDeviceMode | None:
    """The innermost active :class:`EmulatedDeviceMode`, if any."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        for m in reversed(_get_current_dispatch_mode_stack()):
            if isinstance(m, EmulatedDeviceMode):
                return m
    except Exception:  # pragma: no cover
        pass
    return None
