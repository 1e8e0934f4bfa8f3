"""What the aten dump costs on a model whose blocks are compiled one by one, against the same run
without the tool and against the whole model compiled (bench model, Inductor on the CPU):
``python bench/results/session20/blocks_cost.py [rounds] [steps]``.

Four trainers of the bench model (bench/_common.Bench) in one process, steps timed in interleaved
rounds after warm-up, median per-step time: compiled blocks without the tool and inside
``torchparity.dump(level="aten")``, and the whole model compiled without and inside the dump
(its graphs captured the same way; the whole-model row is bench_compile.py's configuration but
through the dump, whose eager capture also records the loss and AdamW's ops at the aten level).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _common import Bench, machine, model_line  # noqa: E402

import torchparity  # noqa: E402


def make(blocks: bool) -> Bench:
    b = Bench("cpu")
    if blocks:
        for i, layer in enumerate(b.model.layers):
            b.model.layers[i] = torch.compile(layer)
    else:
        b.model = torch.compile(b.model)
    return b


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    torch.set_num_threads(2)
    root = tempfile.mkdtemp()
    runs = {}
    for kind in ("blocks", "whole"):
        for tool in ("off", "dump aten"):
            b = make(kind == "blocks")
            for _ in range(3):  # compiled, warm
                b.step()
            runs[(kind, tool)] = b
    times = {k: [] for k in runs}
    for r in range(rounds):  # one dump at a time: each configuration's dump runs for its own steps only
        for (kind, tool), b in runs.items():
            d = torchparity.dump(f"{root}/{kind}{r}", model=b.model, level="aten").start() if tool != "off" else None
            b.step()  # warm-up step inside the dump
            t0 = time.perf_counter()
            for _ in range(steps):
                b.step()
            times[(kind, tool)].append((time.perf_counter() - t0) / steps)
            if d is not None:
                d.stop()
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k[0]} {k[1]} {times[k][-1] * 1e3:.1f} ms" for k in times),
              flush=True)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\n{model_line(runs[('blocks', 'off')])}; {machine()}")
    print("\n| model compiled | tool off | torchparity.dump(level='aten') | ratio |\n|---|---|---|---|")
    for kind in ("blocks", "whole"):
        off, on = statistics.median(times[(kind, "off")]), statistics.median(times[(kind, "dump aten")])
        print(f"| {'layer by layer (compiled blocks)' if kind == 'blocks' else 'whole model'} | {off * 1e3:.1f} ms "
              f"| {on * 1e3:.1f} ms | {on / off:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
