"""Benchmark the job compare on a synthetic multi-rank dump (``bench/synth_job.py``).

    python bench/bench_dist_compare.py --ranks 64 --records 50000 --steps 3 --workers 1,2 --torchrun

For each worker count: ``torchparity compare DEV BENCH --distributed -j W --json`` (local pool) and,
with ``--torchrun``, ``torchrun --nproc-per-node W -m torchparity compare DEV BENCH --json``. Reports
the wall time, records/s per worker (records compared / that worker's busy seconds), the peak RSS per
worker (``resource.getrusage`` in each worker, after each shard) and whether the report names the
planted (step, rank, op). Appends a Markdown section to ``--out`` (default
``bench/results/dist_compare.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(dev: Path, bench: Path, workers: int, torchrun: bool) -> dict:
    """One compare; its JSON summary plus the wall time."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torchparity", "compare", str(dev), str(bench), "--json"]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), "--master-addr",
               "127.0.0.1", "--master-port", str(_port()), "-m", "torchparity", "compare", str(dev), str(bench), "--json"]
    else:
        cmd += ["--distributed", "-j", str(workers)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    out = p.stdout
    try:
        s = json.loads(out[out.index("{"):out.rindex("}") + 1])["summary"]
    except ValueError:
        raise SystemExit(f"compare failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall_s": wall, "exit": p.returncode, "summary": s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="an existing synth_job.py output (default: generate one in a temp dir)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--plant-rank", type=int, default=37)
    ap.add_argument("--plant-step", type=int, default=2)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--torchrun", action="store_true", help="also run under torchrun (gloo)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dist_compare.md"))
    a = ap.parse_args(argv)
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tp_synth_")
        a.dir = tmp.name
    job = Path(a.dir)
    if not (job / "dev").is_dir():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "bench" / "synth_job.py"), str(job), "--ranks", str(a.ranks),
                        "--records", str(a.records), "--steps", str(a.steps), "--plant-rank", str(a.plant_rank),
                        "--plant-step", str(a.plant_step)], check=True)
        print(f"generated in {time.perf_counter() - t0:.1f} s")
    size = sum(f.stat().st_size for f in (job / "dev").rglob("*") if f.is_file())
    lines = [f"## {a.ranks} ranks x {a.steps} steps x {a.records // a.steps} records per (step, rank) "
             f"({a.ranks * (a.records // a.steps) * a.steps} records per side, device side {size / 1e6:.0f} MB)", "",
             f"{platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}; "
             f"{time.strftime('%Y-%m-%d %H:%M')}", "",
             "| engine | workers | wall s | records/s per worker | peak RSS per worker MB | names step/rank/op | exit |",
             "|---|---|---|---|---|---|---|"]
    for torchrun in ([False, True] if a.torchrun else [False]):
        for w in [int(x) for x in a.workers.split(",")]:
            r = run_one(job / "dev", job / "bench", w, torchrun)
            s = r["summary"]
            fd = s.get("first_divergence") or {}
            ok = (fd.get("step"), fd.get("rank")) == (a.plant_step, a.plant_rank)
            ws = s.get("workers", [])
            rps = ", ".join(f"{x['records_per_s']}" for x in ws)
            rss = ", ".join(f"{x['peak_rss_mb']:.0f}" for x in ws)
            row = (f"| {'torchrun' if torchrun else 'local pool'} | {w} | {r['wall_s']:.1f} | {rps} | {rss} | "
                   f"{'yes' if ok else 'NO'}: step {fd.get('step')} rank {fd.get('rank')} {fd.get('op')} "
                   f"({fd.get('name')}) | {r['exit']} |")
            print(row, flush=True)
            lines.append(row)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n")
    print(f"appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
