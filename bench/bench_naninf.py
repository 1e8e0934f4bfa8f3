"""NanInfTracker overhead on the bench model: ``python bench/bench_naninf.py``.

Times forward + backward + AdamW with the tool off, with an empty TorchDispatchMode (the floor
of any dispatch-mode tool: what PyTorch charges for calling Python on every kernel) and with
``torchparity.NanInfTracker``, all in this process, interleaved; writes bench/results/naninf.md.
Target (issue 5): NanInfTracker <= 1.3x the tool-off step time on CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, fmt_ratio, machine, model_line, time_configs  # noqa: E402

import torchparity  # noqa: E402

TARGET = 1.3


class EmptyMode(TorchDispatchMode):
    """Calls every kernel unchanged: the cost of the dispatch-mode machinery alone."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python bench/bench_naninf.py --rounds 7")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the median is reported (default 7)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps after starting the tool (default 1)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round (default 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--quick", action="store_true", help="tiny model, for a smoke test")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "naninf.md"),
                    help="results file (default bench/results/naninf.md)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    bench = Bench(a.device, quick=a.quick)
    configs = {
        "tool off": None,
        "empty TorchDispatchMode": EmptyMode,
        "NanInfTracker": lambda: torchparity.NanInfTracker(bench.model),
    }
    print(model_line(bench), flush=True)
    load0 = _load()
    res = time_configs(bench, configs, rounds=a.rounds, warmup=a.warmup, steps=a.steps)
    load1 = _load()
    base = res["tool off"]
    lines = [
        "# NanInfTracker overhead",
        "",
        f"Command: `python bench/bench_naninf.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        "",
        f"- Model: {model_line(bench)}",
        *[f"- {k}: {v}" for k, v in machine().items()],
        f"- Load average (1/5/15 min) before: {load0}, after: {load1} (this process adds up to its thread count)",
        f"- Protocol: {a.rounds} interleaved rounds x ({a.warmup} warm-up + {a.steps} timed steps, stopping the "
        "tool timed apart); median per-step time; ratio = median / tool-off median in the same process.",
        "",
        "| configuration | ms/step (median) | ratio vs tool off | stop ms |",
        "|---|---|---|---|",
    ]
    for t in res.values():
        lines.append(f"| {t.name} | {t.median * 1000:.1f} | {fmt_ratio(t, base)} | {t.stop_median * 1000:.1f} |")
    nan = res["NanInfTracker"]
    ok = not nan.error and nan.median / base.median <= TARGET
    lines += ["", f"Target: NanInfTracker <= {TARGET}x tool off: **{'met' if ok else 'NOT met'}**.", ""]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every OS
        return "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
