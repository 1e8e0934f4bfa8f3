"""Shared pieces of the benchmarks: the bench model, one training step, and the timing protocol.

Imports only torch and ``torchparity/toymodels.py`` (loaded by file path, so the msprobe worker
can use it from a venv where torchparity is not installed).

Protocol: every configuration is timed in the same process as the tool-off baseline, in rounds
that interleave the configurations (so background load hits all of them alike). In each round a
configuration is started, run ``warmup`` steps, then ``steps`` timed steps (steady state: what a
long run pays per step); stopping the tool (flushing what it still has to write) is timed
separately. The reported time is the median over rounds of the per-step time; ratios divide by
the baseline's median.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _toymodels() -> Any:
    spec = importlib.util.spec_from_file_location("_tp_toymodels", ROOT / "core" / "torchparity" / "toymodels.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses look the module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


toy = _toymodels()
#: the bench model: a Llama-shaped decoder, 4 layers, dim 256, MLP 1024, batch 8 x 128 tokens
BENCH_CONFIG = toy.TinyConfig(vocab=128, dim=256, hidden=1024, layers=4, heads=4, seq=128, batch=8)
QUICK_CONFIG = toy.TinyConfig(vocab=128, dim=64, hidden=128, layers=2, heads=4, seq=16, batch=4)


class Syncs:
    """``sync()`` waits for the bench's device (a no-op on the CPU)."""

    device: torch.device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class DumpRun:
    """A torchparity dump into a fresh directory under ``root``, removed after the round (outside
    the timing: :func:`time_configs` calls ``cleanup()`` after the clock stopped)."""

    def __init__(self, root: str, model: Any, **opts: Any) -> None:
        import tempfile

        import torchparity  # here: the msprobe worker imports this file without torchparity

        self.dir = tempfile.mkdtemp(dir=root)
        self.d = torchparity.dump(self.dir, model=model, **opts)

    def __enter__(self) -> "DumpRun":
        self.d.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.d.stop()

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


class Bench(Syncs):
    """The model, its optimizer and one batch; :meth:`step` is forward + backward + AdamW."""

    def __init__(self, device: str = "cpu", quick: bool = False) -> None:
        self.cfg = QUICK_CONFIG if quick else BENCH_CONFIG
        self.device = torch.device(device)
        self.model = toy.make_model(0, self.cfg).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        inputs, targets = toy.make_batches(1, cfg=self.cfg)[0]
        self.inputs, self.targets = inputs.to(self.device), targets.to(self.device)

    def step(self) -> torch.Tensor:
        logits = self.model(self.inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), self.targets.reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


#: a configuration: a callable returning a context manager that runs the tool (entered/exited
#: around warmup + timed steps), or None for the tool-off baseline
Config = Callable[[], Any]


@dataclass
class Timing:
    name: str
    per_step: list[float] = field(default_factory=list)  # seconds per step, one value per round
    stop: list[float] = field(default_factory=list)  # seconds to stop the tool, one value per round
    error: str | None = None

    @property
    def stop_median(self) -> float:
        return statistics.median(self.stop) if self.stop else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.per_step) if self.per_step else float("nan")


def time_configs(bench: Bench, configs: dict[str, Config | None], *, rounds: int, warmup: int, steps: int,
                 progress: bool = True) -> dict[str, Timing]:
    """Median per-step time of each configuration, interleaved in rounds (see module doc)."""
    out = {name: Timing(name) for name in configs}
    for _ in range(2):  # global warm-up: allocator, lazy init, first-call costs
        bench.step()
    bench.sync()
    for r in range(rounds):
        for name, make in configs.items():
            t = out[name]
            if t.error:
                continue
            try:
                ctx = make() if make is not None else contextlib.nullcontext()
                cm = ctx.__enter__()
                try:
                    for _ in range(warmup):
                        bench.step()
                    bench.sync()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        bench.step()
                    bench.sync()
                    t1 = time.perf_counter()
                finally:
                    ctx.__exit__(None, None, None)
                bench.sync()
                t.stop.append(time.perf_counter() - t1)
                t.per_step.append((t1 - t0) / steps)
                if hasattr(ctx, "cleanup"):  # e.g. delete the dump it wrote (not timed)
                    ctx.cleanup()
                del cm
            except Exception as exc:  # a failing configuration is reported, the others go on
                t.error = f"{type(exc).__name__}: {exc}"[:300]
            if progress:
                last = f"{t.per_step[-1] * 1000:.1f} ms/step" if t.per_step and not t.error else t.error
                print(f"  round {r + 1}/{rounds} {name:<28} {last}", flush=True)
    return out


def machine() -> dict[str, str]:
    """What ran the benchmark (for the results tables)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": f"{cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}",
            "python": platform.python_version(), "torch": torch.__version__, "os": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return info


def fmt_ratio(t: Timing, base: Timing) -> str:
    if t.error:
        return f"failed: {t.error}"
    return f"{t.median / base.median:.2f}x"


def model_line(bench: Bench) -> str:
    c = bench.cfg
    n = sum(p.numel() for p in bench.model.parameters())
    return (f"TinyLlama (torchparity.toymodels) vocab={c.vocab} dim={c.dim} hidden={c.hidden} layers={c.layers} "
            f"heads={c.heads}, batch {c.batch}x{c.seq} tokens, {n / 1e6:.2f} M parameters, float32, "
            f"forward + cross-entropy + backward + AdamW (torch defaults), device {bench.device}")
