"""Paired A/B of the dump's summaries option on bench_launch's launch-bound HF Llama (session 13):
``python bench/results/session13/summaries_ab.py [rounds]``. Configurations interleaved in rounds
in one process (bench_launch.time_both), median per-step wall and process CPU time."""
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _common import DumpRun  # noqa: E402
from bench_launch import LlamaBench, time_both  # noqa: E402

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
bench = LlamaBench("launch")
root = tempfile.mkdtemp()
configs = {"off": None}
for level in ("module", "aten"):
    for summ in ("step", "off"):
        configs[f"{level} summaries={summ}"] = (
            lambda lv=level, s=summ: DumpRun(root, bench.model, level=lv, mode="statistics", summaries=s))


wall, cpu = time_both(bench, configs, rounds=rounds, warmup=2, steps=20)
off_w, off_c = statistics.median(wall["off"]), statistics.median(cpu["off"])
print("| configuration | wall ms/step | wall ratio | CPU ms/step | CPU ratio |\n|---|---|---|---|---|")
for name in configs:
    w, c = statistics.median(wall[name]), statistics.median(cpu[name])
    print(f"| {name} | {w * 1e3:.2f} | {w / off_w:.2f}x | {c * 1e3:.2f} | {c / off_c:.2f}x |")
