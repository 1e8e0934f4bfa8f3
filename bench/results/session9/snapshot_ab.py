"""Session 9 A/B: the watch with a synchronous vs a background snapshot on the ~100M HF Llama,
mean of 20 steps (snapshots at steps 0 and 10) x 3 interleaved rounds, against tool off.
Run from the repository root: python bench/results/session9/snapshot_ab.py (result 2026-11-27:
{"off": 1.0, "sync": 1.307, "async": 1.076})."""
import sys, time, tempfile, statistics, functools
sys.path.insert(0, "bench")
import torch, torchparity
from torchparity.watch import snapshots
from bench_stream import LlamaBench
b = LlamaBench("cpu")
orig = snapshots.SnapshotJob.__init__
def run(mode, steps=20, every=10):
    if mode == "sync":
        snapshots.SnapshotJob.__init__ = lambda self, *a, **k: orig(self, *a, **{**k, "background": False})
    else:
        snapshots.SnapshotJob.__init__ = orig
    ts = []
    if mode == "off":
        for _ in range(steps):
            t0 = time.perf_counter(); b.step(); ts.append(time.perf_counter() - t0)
        return sum(ts) / steps
    with torchparity.watch(b.model, b.opt, output_dir=tempfile.mkdtemp(), every=every) as w:
        for _ in range(steps):
            t0 = time.perf_counter(); w.run(lambda _b: b.step(), (b.ids,)); ts.append(time.perf_counter() - t0)
    return sum(ts) / steps
for _ in range(2): b.step()
res = {"off": [], "sync": [], "async": []}
for r in range(3):
    for m in res:
        res[m].append(run(m))
    print({k: round(v[-1] * 1000, 1) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v) / statistics.median(res["off"]), 3) for k, v in res.items()})
