"""Statistics capture inside torch.compile'd graphs: ``python bench/bench_compile.py``.

The bench model (bench/_common.py) compiled with Inductor, capture off (``backend="inductor"``)
vs on (``torchparity.compile_backend(dir)``, Inductor inside, one dump step per AdamW step):

* per step: both compiled models in this process, timed in interleaved rounds after warm-up,
  median of ``rounds x steps`` (>= 20) step times;
* compile time: the first step (Dynamo + AOTAutograd + Inductor), each in a subprocess with a
  FRESH ``TORCHINDUCTOR_CACHE_DIR`` so both compiles are cold;
* records and host transfers per step of the capture.

Targets (issue 17): <= 1.2x per step, <= 1.5x compile. Writes --out (bench/results/compile.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, machine, model_line  # noqa: E402

STEP_TARGET, COMPILE_TARGET = 1.2, 1.5


_DEVICE_STATS = {"default": None, "off": False, "on": True}


def _make(bench: Bench, on: bool, root: str, device_stats: str = "default", summaries: str = "off"):
    """Compile ``bench.model`` with the capture on or off; returns (compiled model, capture)."""
    import torchparity

    if not on:
        return torch.compile(bench.model, backend="inductor"), None
    cap = torchparity.compile_backend(tempfile.mkdtemp(dir=root), inner="inductor",
                                      device_stats=_DEVICE_STATS[device_stats], summaries=summaries)
    cap.attach(bench.opt)
    return torch.compile(bench.model, backend=cap), cap


def _child(on: bool, device: str, quick: bool, device_stats: str = "default") -> None:
    """One cold compile (a fresh Inductor cache dir was set by the parent): the first step's time."""
    bench = Bench(device, quick=quick)
    root = tempfile.mkdtemp()
    bench.model, cap = _make(bench, on, root, device_stats)
    t0 = time.perf_counter()
    bench.step()
    bench.sync()
    t1 = time.perf_counter()
    if cap is not None:
        cap.close()
    print(json.dumps({"compile_s": t1 - t0}))


def _cold_compile(on: bool, a: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        cmd = [sys.executable, __file__, "--_child", "on" if on else "off", "--device", a.device,
               "--device-stats", a.device_stats]
        if a.quick:
            cmd.append("--quick")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode:
            raise RuntimeError(f"compile run ({'on' if on else 'off'}) failed: {r.stderr.strip().splitlines()[-1:]}")
        return float(json.loads(r.stdout.strip().splitlines()[-1])["compile_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python bench/bench_compile.py --rounds 5 --steps 5")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda (skipped with a message without CUDA)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5; rounds x steps >= 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each model after its compile (default 3)")
    ap.add_argument("--compiles", type=int, default=1, help="cold compiles of each configuration (default 1; 0: per-step figures only)")
    ap.add_argument("--quick", action="store_true", help="tiny model, for a smoke test")
    ap.add_argument("--device-stats", choices=sorted(_DEVICE_STATS), default="default",
                    help="compile_backend(device_stats=...): default (accelerator values batched by the "
                         "in-graph statistics op), off (statistics computed in the graph, one host copy per "
                         "step), on (CPU values batched too)")
    ap.add_argument("--summaries", choices=["off", "step", "close"], default="off",
                    help="compile_backend(summaries=...): off (default, as the library's: no Parquet work while "
                         "training), step (the writer thread builds them at each step's end)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "compile.md"),
                    help="results file (default bench/results/compile.md)")
    ap.add_argument("--_child", choices=["on", "off"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_compile: --device cuda: no CUDA device here; skipped", flush=True)
        return 0
    if a._child:
        _child(a._child == "on", a.device, a.quick, a.device_stats)
        return 0
    if a.rounds * a.steps < 20:
        print("bench_compile: rounds x steps must be >= 20", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp()
    off, on = Bench(a.device, quick=a.quick), Bench(a.device, quick=a.quick)
    print(model_line(off), flush=True)
    off.model, _ = _make(off, False, root)
    on.model, cap = _make(on, True, root, a.device_stats, a.summaries)
    for b in (off, on):
        for _ in range(a.warmup):
            b.step()
        b.sync()
    rec0, tr0, steps0 = sum(cap.records_per_step), cap.transfers, len(cap.records_per_step)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(a.rounds):
        for name, b in (("off", off), ("on", on)):
            for _ in range(a.steps):
                b.sync()
                t0 = time.perf_counter()
                b.step()
                b.sync()
                times[name].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{a.rounds}: off {statistics.median(times['off']) * 1e3:.1f} ms, "
              f"on {statistics.median(times['on']) * 1e3:.1f} ms", flush=True)
    n_steps = len(cap.records_per_step) - steps0
    records = (sum(cap.records_per_step) - rec0) / max(n_steps, 1)
    transfers = (cap.transfers - tr0) / max(n_steps, 1)
    cap.close()
    m_off, m_on = statistics.median(times["off"]), statistics.median(times["on"])
    c_off = [_cold_compile(False, a) for _ in range(a.compiles)]
    c_on = [_cold_compile(True, a) for _ in range(a.compiles)]
    step_ratio = m_on / m_off
    if a.compiles:
        co, cn = statistics.median(c_off), statistics.median(c_on)
        comp_ratio = cn / co
        compile_row = (f"| compile (first step, cold Inductor cache, median of {a.compiles}) | {co:.1f} s | {cn:.1f} s "
                       f"| {comp_ratio:.2f}x | <= {COMPILE_TARGET}x {'met' if comp_ratio <= COMPILE_TARGET else 'NOT met'} |")
    else:
        compile_row = "| compile | not measured (--compiles 0) | | | |"
    cmd = "python bench/bench_compile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Statistics capture inside torch.compile'd graphs (Inductor)",
        "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}. Command: `{cmd.strip()}`.",
        "",
        *[f"- {k}: {v}" for k, v in machine().items()],
        f"- model: {model_line(off)}",
        "",
        "| | capture off (inductor) | capture on (compile_backend, inductor inside) | ratio | target |",
        "|---|---|---|---|---|",
        f"| per step (median of {len(times['off'])} steps, interleaved) | {m_off * 1e3:.1f} ms | {m_on * 1e3:.1f} ms "
        f"| {step_ratio:.2f}x | <= {STEP_TARGET}x {'met' if step_ratio <= STEP_TARGET else 'NOT met'} |",
        compile_row,
        "",
        f"Capture: {records:.0f} records per step, {transfers:.0f} host transfer(s) per step.",
        "",
    ]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
