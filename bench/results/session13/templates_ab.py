"""Paired A/B of pre-encoded compiled records (session 13): ``python
bench/results/session13/templates_ab.py [rounds]``. bench_compile's quick model (launch-bound on
the CPU) compiled three times: capture off, capture on writing record objects each step, capture
on writing pre-encoded lines (LineTemplates, the default); rounds interleaved in one process,
median ms/step."""
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _common import Bench  # noqa: E402

import torchparity  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runs = {}
for name in ("off", "record objects", "pre-encoded lines"):
    b = Bench("cpu", quick=True)
    cap = None
    if name != "off":
        cap = torchparity.compile_backend(tempfile.mkdtemp(), inner="inductor")
        cap.attach(b.opt)
        if name == "record objects":
            write = cap._dump.write_step
            cap._dump.write_step = lambda step, captured, stats, key=None, w=write: w(step, captured, stats, None)
    b.model = torch.compile(b.model, backend=cap if cap is not None else "inductor")
    for _ in range(5):
        b.step()
    runs[name] = (b, cap)
times = {n: [] for n in runs}
for _ in range(rounds):
    for name, (b, cap) in runs.items():
        t = time.perf_counter()
        for _ in range(10):
            b.step()
        times[name].append((time.perf_counter() - t) / 10)
off = statistics.median(times["off"])
print("| configuration | ms/step | ratio |\n|---|---|---|")
for name, ts in times.items():
    m = statistics.median(ts)
    print(f"| {name} | {m * 1e3:.2f} | {m / off:.2f}x |")
for b, cap in runs.values():
    if cap is not None:
        cap.close()
