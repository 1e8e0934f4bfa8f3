"""Cost of one value's statistics on an accelerator, per path: ``python bench/bench_stat_kernel.py --device cuda``.

For each value size, K values are measured by the statistics batcher (capture/stat_batch.py) along
its staging path (``StatBatcher(triton=False)``: a copy into the staging matrix, reduced at flush)
and along its one-pass Triton path (capture/stat_triton.py), then flushed and synchronized:

- host us/value: the training thread's time to queue one value (launches, Python), no sync;
- wall us/value: queue + flush + synchronize, over K (the device's time when it is the bottleneck);
- GB/s: the value bytes over that wall time (a reduction that reads each byte once approaches the
  device's memory bandwidth); ``sum()`` of each value is the reference: one torch reduction kernel.

On the CPU (no Triton kernel there) only the staging path and the reference run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

from torchparity.capture import stat_triton  # noqa: E402
from torchparity.capture.stat_batch import StatBatcher  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(device: str, values: list[torch.Tensor], queue: Callable[[torch.Tensor], Any],
          flush: Callable[[], None], reps: int) -> tuple[float, float]:
    """(host us per value, wall us per value), best of ``reps``."""
    best_host, best_wall = float("inf"), float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for v in values:
            queue(v)
        t1 = time.perf_counter()
        flush()
        _sync(device)
        t2 = time.perf_counter()
        best_host = min(best_host, (t1 - t0) / len(values) * 1e6)
        best_wall = min(best_wall, (t2 - t0) / len(values) * 1e6)
    return best_host, best_wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    ap.add_argument("--sizes", default="1024,16384,262144,4194304,67108864", help="elements per value")
    ap.add_argument("--budget-mb", type=int, default=512, help="value bytes per size (K = budget / value size)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="",
                    help="also time kernel variants BLOCK:warps:programs-per-SM, comma-separated (e.g. 2048:8:8)")
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    dev = torch.device(a.device)
    paths: dict[str, Any] = {"staging": StatBatcher(triton=False)}
    if stat_triton.usable(dev):
        default = (stat_triton.BLOCK, stat_triton.NUM_WARPS, stat_triton.PROGRAMS_PER_SM)
        paths[f"triton {':'.join(map(str, default))}"] = (StatBatcher(), default, True)
        paths["triton, Triton's own launch"] = (StatBatcher(), default, False)
        for spec in [x for x in a.variants.split(",") if x]:
            blk, warps, per_sm = (int(y) for y in spec.split(":"))
            paths[f"triton {spec}"] = (StatBatcher(), (blk, warps, per_sm), True)
    lines = [f"# One value's statistics per path ({a.device}, {a.dtype})", "",
             f"Command: `python bench/bench_stat_kernel.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             *[f"- {k}: {v}" for k, v in machine().items()],
             f"- Triton: {stat_triton.triton.__version__ if stat_triton.triton is not None else 'not used'}", "",
             "| elements/value | values | path | host us/value | wall us/value | GB/s |",
             "|---|---|---|---|---|---|"]
    for n in [int(x) for x in a.sizes.split(",")]:
        k = max(1, min(2000, (a.budget_mb << 20) // (n * torch.empty((), dtype=dtype).element_size())))
        g = torch.Generator(device=a.device).manual_seed(n)
        values = [torch.randn(n, device=a.device, generator=g).to(dtype) for _ in range(k)]
        nbytes = n * values[0].element_size()
        results: list[tuple[str, float, float]] = []
        for name, b in paths.items():
            if isinstance(b, tuple):  # a kernel variant: its constants, a fresh launch cache
                b, (stat_triton.BLOCK, stat_triton.NUM_WARPS, stat_triton.PROGRAMS_PER_SM), direct = b
                stat_triton._compiled.clear()
                stat_triton._direct = None if direct else False
                for g in b._groups.values():
                    if g.partials is not None:
                        g.partials.max_programs = stat_triton._max_programs(dev)
            b.flush()
            for v in values[:2]:  # compile / allocate outside the clock
                b.add(v)
            b.flush()
            host, wall = _time(a.device, values, b.add, b.flush, a.reps)
            results.append((name, host, wall))
        host, wall = _time(a.device, values, torch.sum, lambda: None, a.reps)
        results.append(("reference: sum()", host, wall))
        for name, host, wall in results:
            lines.append(f"| {n} | {k} | {name} | {host:.1f} | {wall:.1f} | {nbytes / (wall * 1e-6) / 1e9:.0f} |")
        print("\n".join(lines[-len(results):]), flush=True)
        del values
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
