"""Dump overhead on the bench model, torchparity vs msprobe: ``python bench/bench_dump.py``.

Times forward + backward + AdamW with the tool off and under ``torchparity.dump`` at every level
(module, api, aten, mix) and mode (statistics, md5, tensor), interleaved in this process, then
msprobe's ``PrecisionDebugger`` at its closest settings (L0 / L1 / mix x statistics / md5 /
tensor), each in a subprocess of the bench venv (msprobe is never a project dependency) with its
own tool-off baseline measured in that subprocess. Writes bench/results/dump.md.

Targets (issue 3): aten + statistics <= 2x the tool-off step time; lower overhead than msprobe
at every comparable setting.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import Bench, Timing, fmt_ratio, machine, model_line, time_configs  # noqa: E402

import torchparity  # noqa: E402

LEVELS = ("module", "api", "aten", "mix")
MODES = ("statistics", "md5", "tensor")
#: torchparity (level, mode) -> the closest msprobe setting (aten has none: msprobe's L2 needs an NPU)
MSPROBE_EQUIVALENT = {
    ("module", "statistics"): "msprobe L0 statistics", ("api", "statistics"): "msprobe L1 statistics",
    ("mix", "statistics"): "msprobe mix statistics", ("api", "md5"): "msprobe L1 md5",
    ("api", "tensor"): "msprobe L1 tensor", ("module", "md5"): "msprobe L0 md5",
    ("module", "tensor"): "msprobe L0 tensor", ("mix", "md5"): "msprobe mix md5",
    ("mix", "tensor"): "msprobe mix tensor",
}
DEFAULT_MSPROBE = ["msprobe L0 statistics", "msprobe L1 statistics", "msprobe mix statistics",
                   "msprobe L1 md5", "msprobe L1 tensor"]
DEFAULT_VENV_PY = "/work/bench-venv/bin/python"
TARGET_ATEN_STATS = 2.0


class _Dump:
    """A torchparity dump into a fresh directory, removed after the round (outside the timing)."""

    def __init__(self, root: str, bench: Bench, level: str, mode: str) -> None:
        self.dir = tempfile.mkdtemp(dir=root)
        self.d = torchparity.dump(self.dir, level=level, mode=mode, model=bench.model)

    def __enter__(self) -> "_Dump":
        self.d.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.d.stop()  # timed: writing what is still queued is part of the cost

    def cleanup(self) -> None:  # called by time_configs after the clock stopped
        shutil.rmtree(self.dir, ignore_errors=True)


def run_msprobe(py: str, names: list[str], rounds: int, warmup: int, steps: int, device: str,
                quick: bool) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if not Path(py).exists():
        for n in names:
            out[n] = {"error": f"no bench venv at {py} (create it: python -m venv /work/bench-venv && "
                               "/work/bench-venv/bin/pip install torch mindstudio-probe)"}
        return out
    for n in names:
        print(f"  {n} (subprocess {py}) ...", flush=True)
        cmd = [py, str(HERE / "_msprobe_worker.py"), n, str(rounds), str(warmup), str(steps), device]
        if quick:
            cmd.append("quick")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                               env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except subprocess.TimeoutExpired:
            out[n] = {"error": "timed out"}
            continue
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            out[n] = {"error": f"worker failed (exit {p.returncode}): {tail[0][:200]}"}
        else:
            out[n] = json.loads(line[7:])
        r = out[n]
        if r.get("on") and r.get("off"):
            print(f"    {statistics.median(r['on']) / statistics.median(r['off']):.2f}x", flush=True)
        else:
            print(f"    {r.get('error')}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python bench/bench_dump.py --rounds 5 "
                                        "--msprobe-python /work/bench-venv/bin/python")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps after starting the tool (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--levels", default=",".join(LEVELS), help="comma list of levels (default all)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of modes (default all)")
    ap.add_argument("--msprobe-python", default=DEFAULT_VENV_PY,
                    help=f"python of a venv with mindstudio-probe (default {DEFAULT_VENV_PY}); '' to skip msprobe")
    ap.add_argument("--msprobe-all", action="store_true",
                    help="also msprobe L0/mix md5 and L0/mix tensor (default: L0/L1/mix statistics, L1 md5, L1 tensor)")
    ap.add_argument("--quick", action="store_true", help="tiny model, for a smoke test")
    ap.add_argument("--out", default=str(HERE / "results" / "dump.md"), help="results file (default bench/results/dump.md)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    bench = Bench(a.device, quick=a.quick)
    print(model_line(bench), flush=True)
    levels = [x for x in a.levels.split(",") if x]
    modes = [x for x in a.modes.split(",") if x]
    root = tempfile.mkdtemp(prefix="tp-bench-dump-")
    configs: dict = {"tool off": None}
    for mode in modes:
        for level in levels:
            configs[f"torchparity {level} {mode}"] = (lambda lv=level, md=mode: _Dump(root, bench, lv, md))
    try:
        res = time_configs(bench, configs, rounds=a.rounds, warmup=a.warmup, steps=a.steps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = res["tool off"]

    ms_names = [n for n in (list(MSPROBE_EQUIVALENT.values()) if a.msprobe_all else DEFAULT_MSPROBE)]
    ms = run_msprobe(a.msprobe_python, ms_names, a.rounds, a.warmup, a.steps, a.device, a.quick) \
        if a.msprobe_python else {}

    def ms_cell(name: str | None) -> str:
        if name is None:
            return "— (no equivalent: msprobe L2 needs an NPU)"
        r = ms.get(name)
        if r is None:
            return f"{name}: not run"
        if r.get("error") or not r.get("on"):
            return f"{name}: failed: {r.get('error')}"
        return f"{name}: {statistics.median(r['on']) / statistics.median(r['off']):.2f}x " \
               f"({statistics.median(r['on']) * 1000:.0f} ms vs {statistics.median(r['off']) * 1000:.0f} ms off)"

    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    ms_ver = next((r.get("version") for r in ms.values() if r.get("version")), None)
    lines = [
        "# Dump overhead: torchparity vs msprobe",
        "",
        f"Command: `python bench/bench_dump.py {cmd}`".replace(" `", " `").rstrip(),
        "",
        f"- Model: {model_line(bench)}",
        *[f"- {k}: {v}" for k, v in machine().items()],
        f"- msprobe: mindstudio-probe {ms_ver} in {a.msprobe_python}" if ms_ver else
        f"- msprobe: not measured ({next(iter(ms.values()), {}).get('error', 'skipped') if ms else 'skipped'})",
        f"- Protocol: {a.rounds} interleaved rounds x ({a.warmup} warm-up + {a.steps} timed steps, stopping the "
        "tool and flushing its writes timed apart); median per-step time; ratio = median / tool-off median "
        "measured in the same process (msprobe: in its own subprocess, baseline measured there before the "
        "debugger is created).",
        "",
        f"Tool off: {base.median * 1000:.1f} ms/step.",
        "",
        "| level | mode | torchparity ms/step | torchparity ratio | stop (flush) ms | msprobe, closest setting |",
        "|---|---|---|---|---|---|",
    ]
    for mode in modes:
        for level in levels:
            t = res[f"torchparity {level} {mode}"]
            lines.append(f"| {level} | {mode} | {t.median * 1000:.1f} | {fmt_ratio(t, base)} | {t.stop_median * 1000:.0f} | "
                         f"{ms_cell(MSPROBE_EQUIVALENT.get((level, mode)))} |")
    verdict = []
    t = res.get("torchparity aten statistics")
    if t is not None and not t.error:
        r = t.median / base.median
        verdict.append(f"- aten + statistics <= {TARGET_ATEN_STATS}x: **{'met' if r <= TARGET_ATEN_STATS else 'NOT met'}** ({r:.2f}x)")
    for (level, mode), name in MSPROBE_EQUIVALENT.items():
        r = ms.get(name)
        key = f"torchparity {level} {mode}"
        if key in res and r and r.get("on") and not res[key].error:
            ours = res[key].median / base.median
            theirs = statistics.median(r["on"]) / statistics.median(r["off"])
            verdict.append(f"- {level} {mode}: torchparity {ours:.2f}x vs {name} {theirs:.2f}x: "
                           f"**{'lower' if ours < theirs else 'NOT lower'}**")
    lines += ["", "## Targets", "", *verdict, ""]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
