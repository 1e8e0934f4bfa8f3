"""Process and main-thread CPU per step of bench_launch's launch-bound Llama: tool off, an empty
dispatch mode, aten+statistics dump (SUMM=off|step); lower quartile of N steps (robust to other
load on a shared machine). Run it with the PYTHONPATH of the tree to measure (see launch.md)."""
import sys, os, time, tempfile, statistics, glob
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch; torch.set_num_threads(1)
from bench_launch import LlamaBench, _EmptyMode
import torchparity
b = LlamaBench("launch")
N = int(os.environ.get("N", "25"))
def steps(n):
    for _ in range(3): b.step()
    out = []
    for _ in range(n):
        t0 = time.process_time(); m0 = time.thread_time(); b.step()
        out.append(((time.process_time() - t0) * 1e3, (time.thread_time() - m0) * 1e3))
    return out
off = steps(N)
with _EmptyMode():
    emp = steps(N)
d = tempfile.mkdtemp()
tool = torchparity.dump(d, level="aten", mode="statistics", model=b.model, summaries=os.environ.get("SUMM", "off"))
tool.start()
on = steps(N)
tool.stop()
recs = [sum(1 for _ in open(f)) for f in glob.glob(d + "/step*/rank*/records.jsonl")]
nrec = statistics.median(recs)
q = lambda xs, i: sorted(x[i] for x in xs)[len(xs) // 4]  # lower quartile: robust to other load
print(f"q25 ms/step: off {q(off,0):.2f} empty {q(emp,0):.2f} on {q(on,0):.2f} ({q(on,0)/q(off,0):.2f}x) main-thread on {q(on,1):.2f}; "
      f"us/record over empty: process {(q(on,0)-q(emp,0))*1e3/nrec:.1f} main {(q(on,1)-q(emp,1))*1e3/nrec:.1f}; records/step {nrec}")
