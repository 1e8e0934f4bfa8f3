"""Python cost per captured op, on models small enough to be launch-bound: ``python bench/bench_launch.py``.

On an accelerator a kernel takes microseconds, so what the tool costs there is its host (Python)
work per op. This bench reproduces that on the CPU with a Llama (HF ``LlamaConfig``, random init)
shrunk until each op takes microseconds: hidden 32, 2 layers, 2 heads, intermediate 64, vocab
128, batch 4x16 (about 1000 aten ops per step). It times forward + cross-entropy + backward +
one AdamW step with the tool off, under an empty ``TorchDispatchMode`` (the floor any aten-level
tool pays), and under ``torchparity.dump`` at each level (module, api, mix, aten) in statistics
mode, plus api + tensor; then the same on a medium Llama (hidden 256, intermediate 1024, 4
layers, 4 heads, batch 8x128) where op cost hides more of the tool.

Protocol (as bench/_common.py): configurations interleaved in rounds in one process, median per-step
time, ratio to the tool-off median. Per captured op: ``(tool - off) / records per step`` in
microseconds, records per step counted from the dumps written. Besides wall time, the process's CPU
time per step (all threads: the writer thread's work counts) is reported: on a shared machine it
moves far less with other people's load than wall time does, so it is the figure to compare runs
by there (``torch.set_num_threads(1)``, so CPU time is host work plus the kernels themselves).

Targets (issue 15, item 3): launch-bound aten + statistics <= 5x, api <= 4x; medium aten 1.2x,
api 1.2x, api + tensor 1.5x.

One more row is a reference, not a tool configuration: "lean Python floor (aten + statistics)" is
``bench/_lean_floor.py``, a consumer of the same op stream that keeps only what a record needs
(name, phase, module path; dtype, shape, stride and statistics of each tensor, measured once per
value; JSON lines from a thread). What it costs, no Python-level aten capture with statistics
measured on the host can go below.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import DumpRun, Syncs, machine  # noqa: E402

import torchparity  # noqa: E402

#: (name, LlamaConfig kwargs, batch, seq)
MODELS = {
    "launch": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=128, max_position_embeddings=64), 4, 16),
    "medium": (dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=128, max_position_embeddings=256), 8, 128),
}
DUMPS = (("module", "statistics"), ("api", "statistics"), ("mix", "statistics"), ("aten", "statistics"),
         ("api", "tensor"))
TARGETS = {("launch", "aten statistics"): 5.0, ("launch", "api statistics"): 4.0,
           ("medium", "aten statistics"): 1.2, ("medium", "api statistics"): 1.2,
           ("medium", "api tensor"): 1.5}


class LlamaBench(Syncs):
    """An HF Llama with random init, AdamW, one fixed batch; the interface of ``_common.Bench``."""

    def __init__(self, which: str, device: str = "cpu") -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        kw, batch, seq = MODELS[which]
        torch.manual_seed(0)
        self.cfg = LlamaConfig(**kw)
        self.cfg._attn_implementation = "eager"
        self.device = torch.device(device)
        self.model = LlamaForCausalLM(self.cfg).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, kw["vocab_size"], (batch, seq), generator=g).to(self.device)
        self.describe = (f"HF Llama (random init) hidden {kw['hidden_size']}, {kw['num_hidden_layers']} layers, "
                         f"{kw['num_attention_heads']} heads, intermediate {kw['intermediate_size']}, vocab "
                         f"{kw['vocab_size']}, batch {batch}x{seq}, "
                         f"{sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M parameters, float32")

    def step(self) -> torch.Tensor:
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


class _Dump(DumpRun):
    """A dump into a fresh directory; counts its records per step before removing it (untimed)."""

    def __init__(self, root: str, bench: LlamaBench, level: str, mode: str, counts: list[float]) -> None:
        super().__init__(root, bench.model, level=level, mode=mode)
        self.counts = counts

    def cleanup(self) -> None:
        per_step = []
        for f in Path(self.dir).glob("step*/rank*/records.jsonl"):
            with open(f, "rb") as fh:
                per_step.append(sum(1 for _ in fh))
        if per_step:
            self.counts.append(statistics.median(per_step))
        shutil.rmtree(self.dir, ignore_errors=True)


class _Lean:
    """bench/_lean_floor.py's reference consumer in a fresh directory (the floor of a Python
    aten-level statistics capture, not a dump); counts its records per step, like :class:`_Dump`."""

    def __init__(self, root: str, bench: LlamaBench, counts: list[float]) -> None:
        from _lean_floor import LeanFloor

        self.dir = tempfile.mkdtemp(dir=root)
        self.lean = LeanFloor(bench.model, self.dir)
        self.counts = counts

    def __enter__(self) -> "_Lean":
        self.lean.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lean.__exit__(*exc)

    def cleanup(self) -> None:
        if self.lean.per_step:
            self.counts.append(statistics.median(self.lean.per_step))
        shutil.rmtree(self.dir, ignore_errors=True)


class _EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only calls the kernel."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return func(*args, **(kwargs or {}))


def count_aten_ops(bench: LlamaBench) -> int:
    """Aten ops of one step (what an aten-level tool intercepts)."""
    n = [0]

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            n[0] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        bench.step()
    return n[0]


def run_model(which: str, root: str, rounds: int, warmup: int, steps: int, device: str,
              only: set[str] | None) -> list[tuple[str, ...]]:
    bench = LlamaBench(which, device)
    counts: dict[str, list[float]] = {}
    configs: dict[str, Any] = {"off": None, "empty TorchDispatchMode": _EmptyMode}
    if not only or "NaN/Inf screen" in only:
        configs["NaN/Inf screen"] = lambda: torchparity.NanInfTracker(bench.model)
    if not only or "NaN/Inf light steps" in only:  # step 0 (warm-up) op by op, the timed steps light
        configs["NaN/Inf light steps"] = lambda: torchparity.NanInfTracker(bench.model, steps=[0], light="module")
    for level, mode in DUMPS:
        name = f"{level} {mode}"
        if only and name not in only:
            continue
        counts[name] = []
        configs[name] = (lambda lv=level, md=mode, c=counts[name]: _Dump(root, bench, lv, md, c))
    name = "lean Python floor (aten + statistics)"
    if (not only or name in only) and device == "cpu":  # host statistics: a CPU reference only
        counts[name] = []
        configs[name] = lambda c=counts[name]: _Lean(root, bench, c)
    n_ops = count_aten_ops(bench)
    print(f"{which}: {bench.describe}; {n_ops} aten ops per step", flush=True)
    wall, cpu = time_both(bench, configs, rounds=rounds, warmup=warmup, steps=steps)
    off, off_cpu = statistics.median(wall["off"]), statistics.median(cpu["off"])
    rows = []
    for name in configs:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        recs = statistics.median(counts[name]) if counts.get(name) else None
        n = recs or n_ops
        target = TARGETS.get((which, name))
        rows.append((which, name, f"{w * 1000:.2f}", f"{w / off:.2f}x", f"{c * 1000:.2f}", f"{c / off_cpu:.2f}x",
                     "-" if name == "off" else (f"{recs:.0f}" if recs else f"{n_ops} ops"),
                     "-" if name == "off" else f"{(w - off) / n * 1e6:.1f}",
                     "-" if name == "off" else f"{(c - off_cpu) / n * 1e6:.1f}",
                     f"<= {target}x" if target else ""))
    return rows


def time_both(bench: LlamaBench, configs: dict[str, Any], *, rounds: int, warmup: int,
              steps: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-step wall and process CPU seconds of each configuration, one value per round, rounds
    interleaving the configurations; stopping the tool (flushing its writer) is inside the timing."""
    wall: dict[str, list[float]] = {n: [] for n in configs}
    cpu: dict[str, list[float]] = {n: [] for n in configs}
    for _ in range(2):
        bench.step()
    for r in range(rounds):
        for name, make in configs.items():
            ctx = make() if make is not None else contextlib.nullcontext()
            ctx.__enter__()
            try:
                for _ in range(warmup):
                    bench.step()
                bench.sync()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    bench.step()
            finally:
                ctx.__exit__(None, None, None)
            bench.sync()
            t1, c1 = time.perf_counter(), time.process_time()
            wall[name].append((t1 - t0) / steps)
            cpu[name].append((c1 - c0) / steps)
            if hasattr(ctx, "cleanup"):
                ctx.cleanup()
            print(f"  round {r + 1}/{rounds} {name:<26} {wall[name][-1] * 1000:8.2f} ms/step wall "
                  f"{cpu[name][-1] * 1000:8.2f} ms/step CPU", flush=True)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="launch,medium", help="comma-separated: launch, medium")
    ap.add_argument("--configs", default=None,
                    help="only these dump configurations, comma-separated (e.g. 'aten statistics,api statistics')")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per round (default 20 launch, 3 medium)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: the host cost per op is what is measured, and "
                         "a shared machine makes multi-threaded tiny kernels erratic)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    only = set(a.configs.split(",")) if a.configs else None
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as root:
        for which in a.models.split(","):
            steps = a.steps or (20 if which == "launch" else 3)
            rows += run_model(which, root, a.rounds, a.warmup, steps, a.device, only)
    m = machine()
    print()
    print(f"Machine: {m['cpu']}; torch {m['torch']}, Python {m['python']}" + (f"; {m['gpu']}" if "gpu" in m else ""))
    print(f"Date: {datetime.datetime.now().isoformat(timespec='minutes')}")
    print(f"Command: python bench/bench_launch.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print()
    print("| model | configuration | wall ms/step | wall ratio | CPU ms/step | CPU ratio | records/step "
          "| wall us/record | CPU us/record | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
