"""The writer thread's share of the training thread's wall time (session 12, 2-core VM).

The statistics batcher is stubbed (no device work: what a GPU host sees once the kernel is fast),
then a dump runs with its writer thread as usual, and again with every batch dropped before the
writer sees it. The difference in the training thread's wall time per step is what the writer's
Python costs it through the GIL. Run from the repository root:
``python bench/results/session12/writer_gil.py aten`` (or ``module``).
"""
import sys, time, torch, tempfile
sys.path.insert(0, 'bench')
torch.set_num_threads(1)
from bench_stream import LlamaBench
import torchparity
from torchparity.capture import stat_batch
from torchparity.dump import writer as W
lv = sys.argv[1]
_chunk = stat_batch._Chunk(); _chunk._rows = [[0.0]*6]*100000; _chunk.n_staged = 100000
def add(self, v):
    self.queued += 1
    return stat_batch.RowRef(_chunk, 0)
stat_batch.StatBatcher.add = add
stat_batch.StatBatcher.flush = lambda self: setattr(self, 'queued', 0)
b = LlamaBench('cpu', hidden=64, layers=2, seq=16, batch=4)
orig_submit = W.DumpWriter.submit
def run(drop, steps=30):
    W.DumpWriter.submit = (lambda self, batch: None) if drop else orig_submit
    with tempfile.TemporaryDirectory() as d:
        t = torchparity.dump(d, level=lv, model=b.model, device_stats=True); t.start()
        for _ in range(3): b.step()
        t.flush()
        p0 = time.process_time(); m0 = time.thread_time(); w0 = time.perf_counter()
        for _ in range(steps): b.step()
        w1 = time.perf_counter(); m1 = time.thread_time()
        t.flush(); p1 = time.process_time()
        t.stop()
    return (w1-w0)/steps*1e3, (m1-m0)/steps*1e3, (p1-p0-(m1-m0))/steps*1e3
for _ in range(3): b.step()
t0=time.perf_counter()
for _ in range(30): b.step()
print(f"off {(time.perf_counter()-t0)/30*1e3:.2f} ms/step")
for r in range(2):
    for drop in (False, True):
        w, m, o = run(drop)
        print(f"{lv} writer {'dropped' if drop else 'on     '}: wall {w:.2f} ms/step, main cpu {m:.2f}, writer cpu {o:.2f}")
