import sys, time, tempfile, cProfile, pstats, os
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
torch.set_num_threads(1)
from bench_launch import LlamaBench, _EmptyMode
import torchparity
level = sys.argv[1] if len(sys.argv) > 1 else "aten"
mode = sys.argv[2] if len(sys.argv) > 2 else "statistics"
prof = "--prof" in sys.argv
b = LlamaBench(os.environ.get("WHICH", "launch"))
def cpu_per_step(ctx_factory, n=int(os.environ.get("N", "30"))):
    for _ in range(3): b.step()
    t0 = time.process_time(); w0 = time.perf_counter()
    for _ in range(n): b.step()
    return (time.process_time() - t0) / n * 1e3, (time.perf_counter() - w0) / n * 1e3
off = cpu_per_step(None)
with _EmptyMode():
    emp = cpu_per_step(None)
d = tempfile.mkdtemp()
if level == "naninf":
    tool = torchparity.NanInfTracker(b.model)
else:
    tool = torchparity.dump(d, level=level, mode=mode, model=b.model, summaries=os.environ.get("SUMM", "step"))
tool.start()
if "--freeze" in sys.argv:
    import gc; gc.freeze()
on = cpu_per_step(None)
if prof:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(10): b.step()
    pr.disable()
tool.stop()
import glob
recs = [sum(1 for _ in open(f)) for f in glob.glob(d + "/step*/rank*/records.jsonl")]
nrec = sorted(recs)[len(recs)//2] if recs else 0
print(f"off {off[0]:.2f} ms cpu ({off[1]:.2f} wall); empty {emp[0]/off[0]:.2f}x; {level}/{mode} {on[0]:.2f} ms cpu = {on[0]/off[0]:.2f}x (wall {on[1]/off[1]:.2f}x); records/step {nrec}; cpu us/record {(on[0]-off[0])*1e3/max(nrec,1):.1f}")
if prof:
    pstats.Stats(pr).sort_stats("tottime").print_stats(45)
