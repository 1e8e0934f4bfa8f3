"""Where a dump's time goes: ``python bench/profile_dump.py --level aten --mode statistics``.

Runs the bench model under ``torchparity.dump`` (or the NanInfTracker with ``--naninf``) and
prints cProfile's top functions by own time for ``--steps`` steady-state steps, plus the step
time with the tool off for scale. A tool for whoever optimises the capture engine.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench  # noqa: E402

import torchparity  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python bench/profile_dump.py --device cuda --level module")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--level", default="aten")
    ap.add_argument("--mode", default="statistics")
    ap.add_argument("--naninf", action="store_true", help="profile the NanInfTracker instead of a dump")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="tottime", help="cProfile order: tottime (default) or cumulative")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--torch-profiler", action="store_true",
                    help="torch.profiler instead of cProfile: the ops' host time and, on cuda, the "
                         "kernels' device time per step (is the step host- or device-bound?)")
    ap.add_argument("--model", default="bench", choices=["bench", "llama1b"],
                    help="bench (default) or llama1b (HF Llama ~1 B, bf16, batch 1x1024: for a GPU)")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step of llama1b (default 1)")
    ap.add_argument("--compiled", action="store_true",
                    help="profile the bench model compiled with torchparity.compile_backend (Inductor inside) "
                         "against the same model compiled with plain Inductor")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model == "llama1b":
        from bench_stream import LlamaBench

        b: Any = LlamaBench(a.device, hidden=2048, layers=16, seq=1024, batch=a.batch, dtype=torch.bfloat16)
    else:
        b = Bench(a.device)
    cap = None
    if a.compiled:
        from bench_compile import _make

        eager = b.model
        b.model, _ = _make(b, False, tempfile.mkdtemp())
    for _ in range(3):
        b.step()
    b.sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        b.step()
    b.sync()
    off = (time.perf_counter() - t0) / a.steps
    with tempfile.TemporaryDirectory() as d:
        if a.compiled:
            b.model = eager
            b.model, cap = _make(b, True, d)
            for _ in range(2):  # compile, then warm
                b.step()
            tool: Any = _Closing(cap)
        else:
            tool = torchparity.NanInfTracker(b.model) if a.naninf else \
                torchparity.dump(d, level=a.level, mode=a.mode, model=b.model)
        tool.start()
        b.step()
        b.sync()
        if a.torch_profiler:
            return _torch_profile(a, b, tool, off)
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        for _ in range(a.steps):
            b.step()
        b.sync()
        pr.disable()
        on = (time.perf_counter() - t0) / a.steps
        tool.stop()
    what = "compile_backend" if a.compiled else "NanInfTracker" if a.naninf else f"dump level={a.level} mode={a.mode}"
    print(f"{what} on {a.device}: {on * 1000:.1f} ms/step under cProfile vs {off * 1000:.1f} ms/step off")
    pstats.Stats(pr).sort_stats(a.sort).print_stats(a.top)
    return 0


class _Closing:
    """A compile capture as a tool: running from the first compiled step, closed at stop()."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.cap.close()


def _device_us(e: Any) -> float:
    """An event's own device time in us (the attribute was renamed across torch releases)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(e, name, None)
        if v is not None:
            return float(v)
    return 0.0


def _torch_profile(a: argparse.Namespace, b: Any, tool: Any, off: float) -> int:
    """``a.steps`` steps under torch.profiler: wall, the device's busy time and the top ops."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            b.step()
        b.sync()
        on = (time.perf_counter() - t0) / a.steps
    tool.stop()
    ev = prof.key_averages()
    dev = sum(_device_us(e) for e in ev) / a.steps / 1000
    what = "compile_backend" if a.compiled else "NanInfTracker" if a.naninf else f"dump level={a.level} mode={a.mode}"
    print(f"{what} on {a.device}: {on * 1000:.1f} ms/step under torch.profiler vs {off * 1000:.1f} ms/step off; "
          f"device busy {dev:.1f} ms/step (kernels' own time)")
    key = "self_cpu_time_total"
    if a.device == "cuda":
        key = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
    print(ev.table(sort_by=key, row_limit=a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
