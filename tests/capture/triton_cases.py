"""Cases of the one-pass Triton statistics kernel, run by test_stat_triton.py in a fresh process.

Triton's interpreter must be on before Triton is first imported (its library functions are made
when it loads), so on the CPU the test runs this file with ``TRITON_INTERPRET=1``; on a CUDA
machine it runs it again on ``cuda`` with the kernel compiled. It prints one JSON object:
``{case: [{"got": row, "want": host_stats row, ...}], "triton_values": .., ...}``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.capture import stat_triton
from torchparity.capture.stat_batch import StatBatcher
from torchparity.capture.stats import host_stats

SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e20, -3.3e38, 1e-30, 65504.0]


def triton_values(b: StatBatcher) -> int:
    """Values queued in the batcher's Triton groups (before its flush)."""
    return sum(len(g.lengths) for key, g in b._groups.items() if key[1] is None)


def measure(values: list[torch.Tensor], **kw: Any) -> dict[str, Any]:
    b = StatBatcher(**kw)
    refs = [b.add(v) for v in values]
    on_kernel = triton_values(b)
    b.flush()
    return {"rows": [{"got": r.values() if r is not None else None, "want": host_stats(v.cpu())}
                     for v, r in zip(values, refs)],
            "triton_values": on_kernel, "flushes": b.flushes, "launches": b.kernel_launches}


def measure_many(values: list[torch.Tensor], **kw: Any) -> dict[str, Any]:
    """The same through ``add_many`` (one launch per dtype), twice: the second run reuses the
    chunk table (and the address table when the addresses are the same)."""
    b = StatBatcher(**kw)
    refs = b.add_many(values)
    on_kernel = triton_values(b)
    launches = b.kernel_launches
    # one launch per (dtype, aligned: address and size multiples of 16) among the kernel's values
    classes = len({(v.dtype, v.data_ptr() % 16 == 0 and v.numel() % 16 == 0) for v in values
                   if stat_triton.eligible(v) and type(v) is torch.Tensor})
    b.flush()
    refs2 = b.add_many(values)
    b.flush()
    return {"rows": [{"got": r.values() if r is not None else None, "want": host_stats(v.cpu())}
                     for v, r in zip(values, refs)],
            "again": [r.values() if r is not None else None for r in refs2],
            "triton_values": on_kernel, "flushes": b.flushes, "launches": launches, "classes": classes}


def random_values(device: str) -> list[torch.Tensor]:
    """float32/bfloat16/float16 around the block (2048) and past programs x two blocks, with specials."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(60):
        dtype = [torch.float32, torch.bfloat16, torch.float16][i % 3]
        n = [1, 3, 2047, 2048, 2049, 4097, 16385, 17000, 70000][i % 9]
        scale = [1.0, 1e3, 1e30, 1e-3][i % 4]
        base = torch.randn(n, generator=g, dtype=torch.float64) * scale
        for j in range(i % 4):
            base[int(torch.randint(0, n, (1,), generator=g))] = SPECIALS[(i + j) % len(SPECIALS)]
        out.append(base.to(dtype).to(device))
    return out


def special_values(device: str) -> list[torch.Tensor]:
    """finfo.min attention masks (squares past float32), all NaN, all -Inf, mixed, signed zeros."""
    vals = [torch.full((3000,), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16),
            torch.tensor([1.0, math.nan, 3.0]), torch.tensor([math.nan] * 5, dtype=torch.float16),
            torch.tensor([-math.inf] * 4), torch.tensor([math.inf, -2.0, -math.inf]),
            torch.tensor([-0.0, 0.0]), torch.full((2,), torch.finfo(torch.float32).max),
            torch.full((5000,), 1e-30)]
    return [v.to(device) for v in vals]


def other_values(device: str) -> list[torch.Tensor]:
    """Staged as before: float64, integers, bool, views with gaps or overlap."""
    vals = [torch.randn(5, dtype=torch.float64), torch.arange(7), torch.ones(3, dtype=torch.bool)]
    # views made on the device itself (``.to(device)`` of a view copies it into a contiguous tensor)
    return [v.to(device) for v in vals] + [torch.randn(4, 6, device=device)[:, ::2],
                                           torch.randn(1, device=device).expand(9),
                                           torch.randn(5, 4, device=device)[1:, 1:]]


def permuted_values(device: str) -> list[torch.Tensor]:
    """Dense in memory but not contiguous (a transpose, channels_last, a permute, a size-1
    dimension with any stride): read by the kernel in memory order."""
    g = torch.Generator().manual_seed(3)
    return [torch.randn(40, 70, generator=g).to(device).t(),
            torch.randn(2, 3, 9, 11, generator=g).to(device).to(memory_format=torch.channels_last),
            torch.randn(3, 5, 7, generator=g).bfloat16().to(device).permute(2, 0, 1),
            torch.randn(6, 1, 5, generator=g).half().to(device).transpose(0, 2)]


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def flush_kernels(device: str, k: int) -> int:
    b = StatBatcher()
    for _ in range(k):
        b.add(torch.randn(2000, device=device))
    with Count() as c:
        b.flush()
    return c.kernels


def main(device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"usable": stat_triton.usable(torch.device(device))}
    out["random"] = measure(random_values(device))
    out["special"] = measure(special_values(device))
    out["other"] = measure(other_values(device))
    out["permuted"] = measure(permuted_values(device))
    out["permuted_contiguous"] = [v.is_contiguous() for v in permuted_values(device)]
    out["asked_off"] = measure([torch.randn(100, device=device)], triton=False)
    # add_many: one launch per dtype for the kernel's values (mixed with staged ones, in order)
    out["many"] = measure_many(random_values(device) + special_values(device) + permuted_values(device)
                               + other_values(device))
    stat_triton.LIMIT_ROWS = 2 * stat_triton.Partials(torch.device(device)).programs(10**6)  # room for two
    out["many_limit"] = measure_many([torch.full((10**6,), float(i), device=device) for i in range(5)])
    stat_triton.LIMIT_ROWS = 1 << 16
    x = torch.arange(6, dtype=torch.float32, device=device)
    b = StatBatcher()
    r = b.add(x)
    x.fill_(math.nan)  # written right after the measurement: the row is of the value before
    b.flush()
    out["overwritten"] = r.values() if r is not None else None
    stat_triton.LIMIT_ROWS = 2 * stat_triton.Partials(torch.device(device)).programs(10**6)  # room for two
    out["limit"] = measure([torch.full((10**6,), float(i), device=device) for i in range(4)])
    stat_triton.LIMIT_ROWS = 1  # less than one value's programs: each value alone, never an empty flush
    out["limit_below_one_value"] = measure([torch.full((10**5,), float(i), device=device) for i in range(3)])
    stat_triton.LIMIT_ROWS = 1 << 16
    out["flush_kernels"] = [flush_kernels(device, 3), flush_kernels(device, 30)]
    # a kernel that cannot compile or launch (Triton builds its launcher with the machine's C
    # compiler): the value and every later one of that device take the staging path
    launch = stat_triton._launch

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Failed to find C compiler")

    stat_triton._launch = broken
    try:
        out["broken"] = measure([torch.randn(100, device=device), torch.randn(7, device=device).half()])
    finally:
        stat_triton._launch = launch
    many = stat_triton.Partials.add_many
    tries: list[str] = []

    def broken_many(self: Any, values: list[torch.Tensor], aligned: bool = False) -> None:
        tries.append(str(values[0].dtype))
        raise RuntimeError("Failed to find C compiler")

    stat_triton.Partials.add_many = broken_many  # type: ignore[assignment]
    try:
        out["many_broken"] = measure_many([torch.randn(100, device=device), torch.randn(7, device=device).half(),
                                           torch.randn(9, device=device).bfloat16()])
        out["many_broken"]["tries"] = tries
    finally:
        stat_triton.Partials.add_many = many  # type: ignore[assignment]
    # the direct launch of the compiled kernel (CUDA) gives the rows Triton's own launch gives
    vals = random_values(device)
    direct = measure(vals)
    out["direct_launch"] = {"used": bool(stat_triton._compiled), "available": stat_triton._direct_ok()}
    saved, stat_triton._direct = stat_triton._direct, False
    stat_triton._compiled.clear()
    out["direct_launch"]["same_rows"] = json.dumps(measure(vals)["rows"]) == json.dumps(direct["rows"])  # NaN too
    stat_triton._direct = saved
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "cpu")))
