import sys, os, runpy, time, gc
import torchparity.dump.summary_live as SL
orig = SL.SummarySink._write
tot = [0.0, 0]
def w(self, *a, **k):
    t0 = time.thread_time()
    if os.environ.get("NOGC"):
        en = gc.isenabled(); gc.disable()
        try:
            r = orig(self, *a, **k)
        finally:
            if en: gc.enable()
    else:
        r = orig(self, *a, **k)
    tot[0] += time.thread_time() - t0; tot[1] += 1
    return r
SL.SummarySink._write = w
sys.argv = ["prof_launch.py"] + sys.argv[1:]
runpy.run_path("bench/results/session7/prof_launch.py", run_name="__main__")
print(f"_write: {tot[1]} calls, {tot[0]/max(tot[1],1)*1e3:.1f} ms writer CPU each")
