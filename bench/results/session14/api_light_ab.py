"""Light tier / unscheduled steps of an api-level dump, its function mode paused (session 14) or not:
``python bench/results/session14/api_light_ab.py [launch|medium] [rounds]``; interleaved rounds, median.
"paused off" replays the old behaviour in the same process (ApiCaptureMode._follow_tier a no-op:
the mode stays on its stack between full steps, passing every call through)."""
import statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from _common import DumpRun
from bench_launch import LlamaBench, time_both
from torchparity.capture.api_mode import ApiCaptureMode
torch.set_num_threads(1)
which = sys.argv[1] if len(sys.argv) > 1 else "launch"
bench = LlamaBench(which)
root = tempfile.mkdtemp()
real = getattr(ApiCaptureMode, "_follow_tier", None)  # None: code before session 14 (never leaves)


class _Old(DumpRun):
    """The dump with its function mode kept on the stack between full steps (before session 14)."""

    def __enter__(self):
        ApiCaptureMode._follow_tier = lambda self: None
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if real is not None:
                ApiCaptureMode._follow_tier = real
            else:
                del ApiCaptureMode._follow_tier


configs = {"off": None,
           "module every step": lambda: DumpRun(root, bench.model, level="module", mode="statistics"),
           "api, light steps, mode kept (before)": lambda: _Old(root, bench.model, level="api", mode="statistics", every=2**30, light="module"),
           "api, light steps, mode off (now)": lambda: DumpRun(root, bench.model, level="api", mode="statistics", every=2**30, light="module"),
           "api, off steps, mode kept (before)": lambda: _Old(root, bench.model, level="api", mode="statistics", every=2**30),
           "api, off steps, mode off (now)": lambda: DumpRun(root, bench.model, level="api", mode="statistics", every=2**30)}
wall, cpu = time_both(bench, configs, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 5, warmup=2, steps=20 if which == "launch" else 3)
off, off_cpu = statistics.median(wall["off"]), statistics.median(cpu["off"])
print("| configuration | wall ms/step | ratio | CPU ms/step | CPU ratio |\n|---|---|---|---|---|")
for n in configs:
    m, c = statistics.median(wall[n]), statistics.median(cpu[n])
    print(f"| {n} | {m*1e3:.2f} | {m/off:.2f}x | {c*1e3:.2f} | {c/off_cpu:.2f}x |")
