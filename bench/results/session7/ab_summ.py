import sys, os, time, tempfile
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
torch.set_num_threads(1)
from _common import Bench
import torchparity
b = Bench("cpu")
def per_step(n=6):
    for _ in range(2): b.step()
    t0 = time.process_time()
    for _ in range(n): b.step()
    return (time.process_time() - t0) / n * 1e3
res = {}
for r in range(2):
    res.setdefault("off", []).append(per_step())
    for s in ("step", "off"):
        d = tempfile.mkdtemp()
        with torchparity.dump(d, level="aten", mode="statistics", model=b.model, summaries=s):
            res.setdefault(f"summaries={s}", []).append(per_step())
off = min(res["off"])
print({k: f"{min(v):.0f} ms = {min(v)/off:.2f}x" for k, v in res.items()})
