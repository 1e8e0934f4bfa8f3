"""``torch.ops.torchparity.value_stats``: a value's ``[max, min, mean, norm, nan, inf]`` as one
opaque op in the instrumented graph.

Opaque on purpose: Inductor has no lowering for it, so it runs it as an extern (fallback) kernel on
the stored buffer. Written as ordinary graph nodes, the reductions were fused into the kernels that
produce the value, and that changed how Inductor tiled those kernels: a reduction it fused into
(an RMSNorm's weight gradient in a bf16 HF Llama) summed in another order and the user's gradients
changed in the last bits. An extern kernel reads the value after it is written and changes nothing
of the user's kernels.

On the CPU the op computes what the eager capture computes (:func:`..capture.stats.host_stats`:
three passes, NaN/Inf counted only when an extreme is not finite; reading a CPU scalar costs no
sync) and returns it in float64, so a value equal in a compiled and an eager run has equal
statistics. Elsewhere it is the device-side ``stats_tensor`` reductions: no host sync per value.
"""

from __future__ import annotations

import torch

from ..capture.stats import host_stats

_LIB: torch.library.Library | None = None


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 or x.device.type == "cpu" else torch.float32


def _value_stats(x: torch.Tensor) -> torch.Tensor:
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


def _value_stats_meta(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((6,), dtype=_acc(x), device=x.device)


def value_stats_op() -> torch._ops.OpOverload:
    """The op (defined on first use)."""
    global _LIB
    if _LIB is None:
        lib = torch.library.Library("torchparity", "DEF")
        lib.define("value_stats(Tensor x) -> Tensor")
        lib.impl("value_stats", _value_stats, "CompositeExplicitAutograd")
        lib.impl("value_stats", _value_stats_meta, "Meta")
        _LIB = lib
    return torch.ops.torchparity.value_stats.default
