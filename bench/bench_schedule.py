"""What the light tier costs: ``python bench/bench_schedule.py``.

Times forward + backward + AdamW on the bench model, interleaved in this process: tool off, a
module-level dump, a full dump at each level, and the same dump scheduled so that every timed
step is a light step (``every`` larger than the run, ``light="module"``: step 0, the untimed
warm-up, is the only full one). Target (issue 15, item 4): a light step costs what a
module-level dump costs. Writes bench/results/schedule.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import Bench, DumpRun, fmt_ratio, machine, model_line, time_configs  # noqa: E402

import torchparity  # noqa: E402,F401 (imported before timing starts)

NEVER = 1 << 30  # an ``every`` no run reaches: every step after step 0 is light


def _Dump(root: str, bench: Bench, **opts: Any) -> DumpRun:
    """A torchparity dump of the bench model into a fresh directory (see ``_common.DumpRun``)."""
    return DumpRun(root, bench.model, **opts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (all light in the light rows)")
    ap.add_argument("--levels", default="aten,api", help="levels whose full and light-only cost is measured")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--quick", action="store_true", help="tiny model, for a smoke test")
    ap.add_argument("--out", default=str(HERE / "results" / "schedule.md"))
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    bench = Bench(a.device, quick=a.quick)
    root = tempfile.mkdtemp(prefix="tp-bench-schedule-")
    levels = [x for x in a.levels.split(",") if x]
    configs: dict = {"tool off": None,
                     "module statistics (every step)": lambda: _Dump(root, bench, level="module")}
    for lv in levels:
        configs[f"{lv} statistics, full steps"] = (lambda lv=lv: _Dump(root, bench, level=lv))
        configs[f"{lv} statistics, light steps"] = (lambda lv=lv: _Dump(root, bench, level=lv, every=NEVER, light="module"))
    try:
        res = time_configs(bench, configs, rounds=a.rounds, warmup=1, steps=a.steps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = res["tool off"]
    mod = res["module statistics (every step)"]
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# Light tier cost (frequency scheduling)", "",
             f"Command: `python bench/bench_schedule.py {cmd}`".rstrip(), "",
             f"- Model: {model_line(bench)}", *[f"- {k}: {v}" for k, v in machine().items()],
             f"- Protocol: {a.rounds} interleaved rounds x (1 warm-up + {a.steps} timed steps); median per-step "
             "time; ratio = median / tool-off median in the same process. Light rows: every=2**30, "
             "light='module', so step 0 (warm-up) is the only full step and every timed step is light.", "",
             f"Tool off: {base.median * 1000:.1f} ms/step.", "",
             "| configuration | ms/step | ratio |", "|---|---|---|"]
    for name, t in res.items():
        lines.append(f"| {name} | {t.median * 1000:.1f} | {fmt_ratio(t, base)} |")
    lines += ["", "## Target", ""]
    for lv in levels:
        t = res[f"{lv} statistics, light steps"]
        if not t.error and not mod.error:
            lines.append(f"- {lv} light steps vs module-level dump: {t.median / base.median:.2f}x vs "
                         f"{mod.median / base.median:.2f}x")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
