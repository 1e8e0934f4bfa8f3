import sys, time, tempfile, statistics, collections
sys.path.insert(0, "bench")
import torch
from _common import Bench
import torchparity
from torchparity.compile import stats_op
acc = collections.Counter(); sizes=[]; dts=collections.Counter(); tt=collections.Counter()
orig = stats_op.host_stats
def timed(x):
    t=time.perf_counter(); r=orig(x); acc['stats']+=time.perf_counter()-t; acc['n']+=1; sizes.append(x.numel()); dts[(str(x.dtype), x.is_contiguous())]+=1; tt[str(x.dtype)]+=time.perf_counter()-t; return r
stats_op.host_stats = timed
orig_vs = stats_op._value_stats
b = Bench("cpu"); off = Bench("cpu")
cap = torchparity.compile_backend(tempfile.mkdtemp(), inner="inductor"); cap.attach(b.opt)
b.model = torch.compile(b.model, backend=cap)
off.model = torch.compile(off.model, backend="inductor")
for _ in range(3): b.step(); off.step()
acc.clear(); sizes.clear(); dts.clear(); tt.clear()
ton=[]; toff=[]
for r in range(4):
    for _ in range(5):
        t=time.perf_counter(); b.step(); ton.append(time.perf_counter()-t)
    for _ in range(5):
        t=time.perf_counter(); off.step(); toff.append(time.perf_counter()-t)
n=len(ton)
print("off", statistics.median(toff)*1e3, "on", statistics.median(ton)*1e3, "ratio", statistics.median(ton)/statistics.median(toff))
print("stats ms/step", acc['stats']/n*1e3, "values/step", acc['n']/n)
import numpy as np
s=np.array(sizes[:acc['n']//n]); print("sizes", np.percentile(s,[0,25,50,75,100]), "total elems", s.sum())
cap.close()
import cProfile, pstats
cap2 = torchparity.compile_backend(tempfile.mkdtemp(), inner="inductor")
print(dts, {k: v/n*1e3 for k,v in tt.items()})
