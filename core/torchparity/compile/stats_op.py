"""The statistics ops of an instrumented graph: ``torch.ops.torchparity.value_stats`` (one value's
``[max, min, mean, norm, nan, inf]``) and ``value_stats_many`` (the rows of a group of values).

Opaque on purpose: Inductor has no lowering for them, so it runs them as extern (fallback) kernels
on the stored buffers. Written as ordinary graph nodes, the reductions were fused into the kernels
that produce the value, and that changed how Inductor tiled those kernels: a reduction it fused
into (an RMSNorm's weight gradient in a bf16 HF Llama) summed in another order and the user's
gradients changed in the last bits. An extern kernel reads the value after it is written and
changes nothing of the user's kernels.

On the CPU, ``value_stats`` computes what the eager capture computes
(:func:`..capture.stats.host_stats`: three passes, NaN/Inf counted only when an extreme is not
finite; reading a CPU scalar costs no sync) and returns it in float64, so a value equal in a
compiled and an eager run has equal statistics (one node per value, which Inductor schedules
where it sees fit: often right after the value is made). On an accelerator, inside a capture's
graph run (:func:`collecting`), a group of values goes to the capture's
:class:`~..capture.stat_batch.StatBatcher` in one ``value_stats_many`` call: one Triton kernel launch per dtype for the group (or one copy kernel
per value into the batcher's staging buffer), the reductions of many values at once when it
flushes, no host sync; the op returns an uninitialised placeholder (each row is the batcher's,
found by its ``slot``). A value the batcher does not take is measured by the op itself
(device-side ``stats_tensor`` reductions, no host sync either).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

from ..capture.stats import host_stats

_LIB: torch.library.Library | None = None
#: the graph run being captured on this thread (the autograd engine runs a CUDA backward graph
#: on its own device thread): its batcher, the refs list indexed by slot, and the CPU policy
_RUN = threading.local()


@contextlib.contextmanager
def collecting(batcher: Any, refs: list[Any], cpu_too: bool = False) -> Iterator[None]:
    """Within: ``value_stats(x, slot)`` of an accelerator value (or of any value with ``cpu_too``)
    is queued on ``batcher`` and its :class:`~..capture.stat_batch.RowRef` put at ``refs[slot]``."""
    prev = getattr(_RUN, "batch", None)
    _RUN.batch = (batcher, refs, cpu_too)
    try:
        yield
    finally:
        _RUN.batch = prev


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 or x.device.type == "cpu" else torch.float32


#: what the op returns for a batched value, one per (device, dtype): the value's row is the
#: batcher's, and the capture's wrapper drops this output unread (a fresh ``torch.empty`` per
#: value cost ~5 us of host time on the GPU's allocator, a third of queuing the value)
_PLACEHOLDERS: dict[tuple[torch.device, torch.dtype, tuple[int, ...]], torch.Tensor] = {}


def _placeholder(device: torch.device, dtype: torch.dtype, shape: tuple[int, ...] = (6,)) -> torch.Tensor:
    """The unwritten output of a statistics op whose rows are all the batcher's (one per device,
    dtype and shape), as a fresh alias: autograd metadata an op call may attach to its output
    never lands on the shared tensor."""
    key = (device, dtype, shape)
    p = _PLACEHOLDERS.get(key)
    if p is None:
        with torch.inference_mode(False), torch.no_grad():
            p = _PLACEHOLDERS[key] = torch.empty(shape, dtype=dtype, device=device)
    return p.detach()


def _value_stats(x: torch.Tensor, slot: int = -1) -> torch.Tensor:
    run = getattr(_RUN, "batch", None)
    if run is not None and slot >= 0 and (x.device.type != "cpu" or run[2]):
        ref = run[0].add(x)
        if ref is not None:  # None: nothing to stage (an empty value at run time): measured below
            run[1][slot] = ref
            return _placeholder(x.device, _acc(x))
    if x.device.type == "cpu":
        vals = host_stats(x)
        if vals is None:  # empty
            return torch.full((6,), float("nan"), dtype=torch.float64)
        return torch.tensor(vals, dtype=torch.float64)
    f = x.to(_acc(x))
    if f.numel() == 0:
        return torch.full((6,), float("nan"), dtype=f.dtype, device=f.device)
    mn, mx = torch.aminmax(f)
    return torch.stack([mx, mn, f.mean(), torch.linalg.vector_norm(f), torch.isnan(x).sum().to(f.dtype),
                        torch.isinf(x).sum().to(f.dtype)])


def _value_stats_meta(x: torch.Tensor, slot: int = -1) -> torch.Tensor:
    return torch.empty((6,), dtype=_acc(x), device=x.device)


def _value_stats_many(xs: list[torch.Tensor], first_slot: int = 0) -> torch.Tensor:
    """The statistics of a group of captured values (consecutive in the graph) in ONE op call:
    ``[len(xs), 6]`` float64 on the first value's device. Inside a capture run, accelerator values
    go to the batcher together (:meth:`~..capture.stat_batch.StatBatcher.add_many`: one kernel
    launch per dtype, not one launch and some 50 us of host time per value); their rows are the
    batcher's (``refs[first_slot + i]``) and their rows of the output are left unwritten."""
    k = len(xs)
    device = xs[0].device
    done: list[bool] = [False] * k
    run = getattr(_RUN, "batch", None)
    if run is not None and first_slot >= 0:
        batcher, refs, cpu_too = run
        sel = [i for i, x in enumerate(xs) if x.device.type != "cpu" or cpu_too]
        if sel:
            for i, ref in zip(sel, batcher.add_many([xs[i] for i in sel])):
                if ref is not None:
                    refs[first_slot + i] = ref
                    done[i] = True
        if all(done):
            return _placeholder(device, torch.float64, (k, 6))
    out = torch.empty((k, 6), dtype=torch.float64, device=device)
    for i, x in enumerate(xs):
        if not done[i]:
            out[i].copy_(_value_stats(x))
    return out


def _value_stats_many_meta(xs: list[torch.Tensor], first_slot: int = 0) -> torch.Tensor:
    return torch.empty((len(xs), 6), dtype=torch.float64, device=xs[0].device)


def _define() -> None:
    global _LIB
    if _LIB is None:
        lib = torch.library.Library("torchparity", "DEF")
        lib.define("value_stats(Tensor x, int slot=-1) -> Tensor")
        lib.impl("value_stats", _value_stats, "CompositeExplicitAutograd")
        lib.impl("value_stats", _value_stats_meta, "Meta")
        lib.define("value_stats_many(Tensor[] xs, int first_slot=0) -> Tensor")
        lib.impl("value_stats_many", _value_stats_many, "CompositeExplicitAutograd")
        lib.impl("value_stats_many", _value_stats_many_meta, "Meta")
        _LIB = lib


def value_stats_op() -> torch._ops.OpOverload:
    """The one-value op (defined on first use)."""
    _define()
    return torch.ops.torchparity.value_stats.default


def value_stats_many_op() -> torch._ops.OpOverload:
    """The many-values op (defined on first use): what the graph pass adds once per group of
    values on an accelerator (:func:`~.instrument._stats_nodes`)."""
    _define()
    return torch.ops.torchparity.value_stats_many.default
