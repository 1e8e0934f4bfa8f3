"""Light tier / unscheduled steps of an aten-level dump vs a module-level dump and an empty dispatch mode
(session 13): ``python bench/results/session13/light_ab.py [launch|medium] [rounds]``; interleaved rounds, median."""
import statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from _common import DumpRun
from bench_launch import LlamaBench, time_both, _EmptyMode
torch.set_num_threads(1)
which = sys.argv[1] if len(sys.argv) > 1 else "launch"
bench = LlamaBench(which)
root = tempfile.mkdtemp()
configs = {"off": None, "empty mode": _EmptyMode,
           "module every step": lambda: DumpRun(root, bench.model, level="module", mode="statistics"),
           "aten, light steps": lambda: DumpRun(root, bench.model, level="aten", mode="statistics", every=2**30, light="module"),
           "aten, off steps": lambda: DumpRun(root, bench.model, level="aten", mode="statistics", every=2**30)}
wall, cpu = time_both(bench, configs, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 5, warmup=2, steps=20 if which == "launch" else 3)
off = statistics.median(wall["off"])
print("| configuration | ms/step | ratio |\n|---|---|---|")
for n in configs:
    m = statistics.median(wall[n]); print(f"| {n} | {m*1e3:.2f} | {m/off:.2f}x |")
