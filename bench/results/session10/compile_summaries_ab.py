import sys, time, tempfile, statistics, os
sys.path.insert(0, "bench")
import torch
from _common import Bench
import torchparity
import torchparity.dump.writer as W
mode = sys.argv[1]
import os
if os.environ.get("SWI"): sys.setswitchinterval(float(os.environ["SWI"]))
orig = W.DumpWriter.__init__
def init(self, *a, **k):
    k["summaries"] = mode; k["fsync"] = sys.argv[2] == "1"
    orig(self, *a, **k)
W.DumpWriter.__init__ = init
b = Bench("cpu"); off = Bench("cpu")
cap = torchparity.compile_backend(tempfile.mkdtemp(), inner="inductor"); cap.attach(b.opt)
b.model = torch.compile(b.model, backend=cap)
off.model = torch.compile(off.model, backend="inductor")
for _ in range(3): b.step(); off.step()
ton=[]; toff=[]; c0=[]; c1=[]
for r in range(6):
    for _ in range(5):
        t=time.perf_counter(); p=time.process_time(); b.step(); ton.append(time.perf_counter()-t); c1.append(time.process_time()-p)
    for _ in range(5):
        t=time.perf_counter(); p=time.process_time(); off.step(); toff.append(time.perf_counter()-t); c0.append(time.process_time()-p)
print(mode, sys.argv[2], "wall ratio %.3f" % (statistics.median(ton)/statistics.median(toff)), "cpu ratio %.3f" % (statistics.median(c1)/statistics.median(c0)), statistics.median(toff)*1e3, statistics.median(ton)*1e3)
cap.close()
