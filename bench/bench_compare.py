"""Benchmark: `torchparity.compare` on two statistics dumps of 100k records each.

Target (issue 4): < 5 s. The dumps are synthesized (one input and one output per record, chained
by producer, a planted x1.5 fault at record 60 000). The baseline measured in the same command is
plain reading: json-parsing both records.jsonl files, which any compare must do. msprobe's compare
is run on the same pair written in msprobe's statistics format (dump.json/stack.json/construct.json)
when `mindstudio-probe` is installed in /work/bench-venv (never a project dependency), next to
`torchparity.compare` on that msprobe-format pair; otherwise the results file says why not.

    .venv/bin/python bench/bench_compare.py [--records 100000] [--repeat 2] [--msprobe-records N]
                                            [--out bench/results/compare.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _read_baseline(root: Path) -> float:
    t0 = time.perf_counter()
    with open(root / "step0" / "rank0" / "records.jsonl", "rb") as f:
        for line in f:
            json.loads(line)
    return time.perf_counter() - t0


def _loadavg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _runs(ts: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in ts)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--msprobe-records", type=int, default=None,
                    help="records per side of the msprobe-format pair (default: --records; 0 skips msprobe)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "compare.md"))
    a = ap.parse_args()

    import torchparity
    from torchparity.compare._testing import bulk_stats_dump

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        bench = bulk_stats_dump(tmp / "bench", a.records)
        dev = bulk_stats_dump(tmp / "dev", a.records, fault_at=int(a.records * 0.6), factor=1.5)
        synth = time.perf_counter() - t0
        size = (dev / "step0" / "rank0" / "records.jsonl").stat().st_size
        torchparity.compare(dev, bench)  # warm-up: imports (pandas, numpy, plugins)
        load_before = _loadavg()
        times, reads = [], []
        for _ in range(a.repeat):
            reads.append(_read_baseline(dev) + _read_baseline(bench))
            t0 = time.perf_counter()
            res = torchparity.compare(dev, bench)
            times.append(time.perf_counter() - t0)
        rc = res.root_cause
        ok = rc is not None and rc.index == int(a.records * 0.6)
        load_after = _loadavg()
        t_cmp, t_read = statistics.median(times), statistics.median(reads)
        ms = _msprobe_section(tmp, a.records if a.msprobe_records is None else a.msprobe_records)
        lines = [
            "# Benchmark: compare two statistics dumps",
            "",
            f"Command: `{' '.join(['.venv/bin/python', 'bench/bench_compare.py', *sys.argv[1:]])}`"
            f" (machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
            f"pandas {_version('pandas')}, orjson {_version('orjson')}, {os.cpu_count()} CPUs; load average "
            f"(1/5/15 min) {load_before} before the timed runs, {load_after} after: the machine is shared). "
            f"Synthesis of the two dumps: {synth:.1f} s, {size / 1e6:.1f} MB of records.jsonl each.",
            "",
            f"| what | median of {a.repeat} | all runs | ratio to baseline (medians) |",
            "|---|---|---|---|",
            f"| baseline: json-parse both records.jsonl ({2 * a.records} records) | {t_read:.2f} s | "
            f"{_runs(reads)} | 1.00 |",
            f"| `torchparity.compare` (read, match, metrics, root cause, verdicts; no reports) | {t_cmp:.2f} s | "
            f"{_runs(times)} | {t_cmp / t_read:.2f} |",
            "",
            f"Target < 5 s: **{'met' if t_cmp < 5 else 'NOT met'}** ({t_cmp:.2f} s). Root cause found at the "
            f"planted record {int(a.records * 0.6)}: **{'yes' if ok else 'no'}** ({rc.name if rc else None}). "
            f"Rows compared: {res.summary['n_rows']}.",
            "",
            "## msprobe",
            "",
            ms,
            "",
        ]
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join(lines))
        print("\n".join(lines))


def msprobe_stats_dump(root: Path, n_records: int, *, seed: int = 0, fault_at: int | None = None,
                       factor: float = 1.5) -> Path:
    """The same synthetic pair as :func:`bulk_stats_dump`, in msprobe's statistics format:
    ``step0/rank0/{dump.json, stack.json, construct.json}``; one API call per record
    (``Functional.linear`` / ``Torch.add`` / ``Functional.gelu`` / ``Tensor.__mul__``), one input
    and one output each, a planted x``factor`` from ``fault_at`` on."""
    import random

    rnd = random.Random(seed)
    d = root / "step0" / "rank0"
    d.mkdir(parents=True, exist_ok=True)
    apis = ["Functional.linear", "Torch.add", "Functional.gelu", "Tensor.__mul__"]
    counters: dict[str, int] = {}
    data: dict[str, Any] = {}
    construct: dict[str, Any] = {}
    stack: dict[str, Any] = {}
    norm, scale = 10.0, 1.0

    def desc(st: dict[str, float]) -> dict[str, Any]:
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [16, 64], "requires_grad": True,
                "Max": st["max"], "Min": st["min"], "Mean": st["mean"], "Norm": st["norm"]}

    for i in range(n_records):
        api = apis[i % 4]
        cnt = counters.get(api, 0)
        counters[api] = cnt + 1
        name = f"{api}.{cnt}.forward"
        in_st = {"max": 3.0 * scale, "min": -3.0 * scale, "mean": 0.01 * scale, "norm": norm * scale}
        if fault_at is not None and i == fault_at:
            scale *= factor
        norm_out = 10.0 * (1 + 0.1 * rnd.random())
        out_st = {"max": 3.0 * scale, "min": -3.0 * scale, "mean": 0.01 * scale, "norm": norm * scale}
        norm = norm_out
        data[name] = {"input_args": [desc(in_st)], "input_kwargs": {}, "output": [desc(out_st)]}
        construct[name] = None
        if i < 100:
            stack[str(i)] = [[name], [f"train.py:{i} in step"]]
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": data}))
    (d / "construct.json").write_text(json.dumps(construct))
    (d / "stack.json").write_text(json.dumps(stack))
    return root


def _msprobe_compare(dev: Path, bench: Path, out: Path) -> tuple[float | None, str]:
    """Time ``msprobe compare`` (its CLI, in /work/bench-venv) on one rank's dump.json pair."""
    exe = Path("/work/bench-venv/bin/msprobe")
    if not exe.exists():
        return None, "msprobe not measured: /work/bench-venv/bin/msprobe does not exist."
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "compare", "-tp", str(dev / "step0" / "rank0" / "dump.json"),
           "-gp", str(bench / "step0" / "rank0" / "dump.json"), "-o", str(out)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    t = time.perf_counter() - t0
    files = sorted(p.name for p in out.iterdir())
    if r.returncode != 0 or not files:
        tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
        return None, f"msprobe compare failed (exit {r.returncode}): " + " | ".join(tail)
    return t, f"wrote {', '.join(files)}"


def _msprobe_section(tmp: Path, n: int) -> str:
    """Time msprobe's compare and torchparity.compare on the same pair in msprobe's format."""
    import torchparity

    if n <= 0:
        return "msprobe not measured (--msprobe-records 0)."
    note = _msprobe_note()
    if not note.startswith("ok"):
        return note
    fault = int(n * 0.6)
    mb = msprobe_stats_dump(tmp / "ms_bench", n)
    md = msprobe_stats_dump(tmp / "ms_dev", n, fault_at=fault, factor=1.5)
    size = (md / "step0" / "rank0" / "dump.json").stat().st_size
    t_ms, what = _msprobe_compare(md, mb, tmp / "ms_out")
    t0 = time.perf_counter()
    res = torchparity.compare(md, mb)
    t_tp = time.perf_counter() - t0
    rc = res.root_cause
    lines = [
        f"Same synthetic pair written in msprobe's statistics format (step0/rank0/dump.json, stack.json, "
        f"construct.json; {n} API records per side, {size / 1e6:.1f} MB dump.json each, planted x1.5 at record {fault}). "
        f"msprobe (mindstudio-probe, /work/bench-venv) runs as `msprobe compare -tp DEV/dump.json -gp BENCH/dump.json -o OUT` "
        f"(its CLI, timed as a subprocess, so its interpreter start-up is included); torchparity reads the same dump.json files.",
        "",
        "| what | time (1 run) | ratio to msprobe |",
        "|---|---|---|",
    ]
    if t_ms is None:
        lines.append(f"| msprobe compare | failed | - |")
    else:
        lines.append(f"| msprobe compare ({what}) | {t_ms:.2f} s | 1.00 |")
    lines.append(f"| `torchparity.compare` on the msprobe pair | {t_tp:.2f} s | "
                 f"{(t_tp / t_ms) if t_ms else float('nan'):.3f} |")
    lines += ["", f"torchparity root cause on the msprobe pair: {rc.name if rc else None} (index {rc.index if rc else None}; "
              f"planted at {fault}). msprobe's compare has no root cause; it gives each row pass/warning/error."]
    if t_ms is None:
        lines += ["", what]
    return "\n".join(lines)


def _msprobe_note() -> str:
    venv = Path("/work/bench-venv/bin/python")
    if not venv.exists():
        return "msprobe not measured: /work/bench-venv does not exist."
    r = subprocess.run([str(venv), "-c", "import msprobe"], capture_output=True, text=True)
    if r.returncode != 0:
        return ("msprobe not measured: `pip install mindstudio-probe` into /work/bench-venv failed on this machine "
                "(no network access to the package index), so the side-by-side comparison could not be run here.")
    return "ok"


if __name__ == "__main__":
    main()
