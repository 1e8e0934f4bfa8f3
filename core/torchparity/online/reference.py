"""Running one op again on the reference backend, in the device's dtype and in high precision.

Everything here runs inside :class:`~torchparity.capture.session.tool_work` (callers make sure),
so other torchparity dispatch modes — the emulated device, the dump — leave these ops alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .judge import dtype_name


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.is_complex()


def snapshot(tree: Any, device: torch.device | str = "cpu") -> Any:
    """Detached copies of every tensor (aliasing between arguments kept), other values as is."""
    seen: dict[int, torch.Tensor] = {}

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            hit = seen.get(id(x))
            if hit is None:
                hit = seen[id(x)] = x.detach().to(device, copy=True)
            return hit
        return x

    return tree_map(copy, tree)


def cast_copy(tree: Any, to_dtype: Callable[[torch.dtype], torch.dtype], device: torch.device | str) -> Any:
    """Fresh copies of the tensors on ``device`` with floating dtypes mapped by ``to_dtype``;
    ``device=`` arguments point at ``device``."""
    seen: dict[int, torch.Tensor] = {}
    dev = torch.device(device)

    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            hit = seen.get(id(x))
            if hit is None:
                dt = to_dtype(x.dtype) if _is_float(x) else x.dtype
                hit = seen[id(x)] = x.detach().to(dev, dt, copy=True)
            return hit
        if isinstance(x, torch.device):
            return dev
        return x

    return tree_map(conv, tree)


def written_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an op writes to (in-place, ``out=``), from its schema's alias annotations."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out: list[torch.Tensor] = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        out.extend(t for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor))
    return out


def collect_outputs(func: Any, args: tuple, kwargs: dict, result: Any) -> list[torch.Tensor | None]:
    """What an op produced: its returned tensors, then the arguments it wrote to and did not
    return (``_foreach_add_`` returns nothing). Non-tensor leaves are ``None`` placeholders."""
    leaves = tree_flatten(result)[0]
    outs: list[torch.Tensor | None] = [x if isinstance(x, torch.Tensor) else None for x in leaves]
    returned = {id(x) for x in outs if x is not None}
    outs.extend(t for t in written_args(func, args, kwargs) if id(t) not in returned)
    return outs


@dataclass
class ReferenceRun:
    """The reference outputs of one op (CPU tensors, ``None`` where the op returned no tensor)."""

    same: list[torch.Tensor | None] | None = None
    high: list[torch.Tensor | None] | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def _run(func: Any, args: tuple, kwargs: dict, to_dtype: Callable[[torch.dtype], torch.dtype],
         device: Any) -> list[torch.Tensor | None]:
    a, k = cast_copy((args, kwargs), to_dtype, device)
    res = func(*a, **k)
    return [None if t is None else t.detach().to("cpu") for t in collect_outputs(func, a, k, res)]


def run_reference(func: Any, args: tuple, kwargs: dict, *, same_dtype: Callable[[torch.dtype], torch.dtype],
                  high_dtype: Callable[[torch.dtype], torch.dtype], device: Any = "cpu") -> ReferenceRun:
    """Run ``func`` on ``device`` twice: with floating inputs in the device's compute dtype
    (``same_dtype``) and in high precision (``high_dtype``). Where the backend cannot compute a
    dtype the run is upcast to float32 and ``notes`` says so."""
    run = ReferenceRun()
    f32 = lambda d: torch.complex64 if d.is_complex else torch.float32  # noqa: E731
    try:
        run.same = _run(func, args, kwargs, same_dtype, device)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        try:
            wanted = {dtype_name(same_dtype(t.dtype)) for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor) and _is_float(t)}
            outs = _run(func, args, kwargs, f32, device)
            # round to the device's dtype, as the device would have stored the result
            target = getattr(torch, next(iter(wanted))) if len(wanted) == 1 else None
            run.same = [t.to(target) if t is not None and target is not None and t.dtype.is_floating_point
                        else t for t in outs]
            run.notes.append(f"upcast {'/'.join(sorted(wanted))}->float32 for the same-dtype reference "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        except Exception as exc2:  # noqa: BLE001 - report, never crash the user's run
            run.error = f"reference failed: {type(exc2).__name__}: {str(exc2).splitlines()[0][:200]}"
            return run
    try:
        run.high = _run(func, args, kwargs, high_dtype, device)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        try:
            run.high = _run(func, args, kwargs, f32, device)
            run.notes.append(f"high-precision reference computed in float32 ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:120]})")
        except Exception as exc2:  # noqa: BLE001
            run.error = f"high-precision reference failed: {type(exc2).__name__}: {str(exc2).splitlines()[0][:200]}"
    return run
