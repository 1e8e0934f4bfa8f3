"""Precision bisect benchmark: re-runs needed on synthetic stacks of N modules with one planted
culprit (target <= 2 log2 N + a few), and the wall time of a bisect on the bench model.

    python bench/bench_bisect.py [--out bench/results/bisect.md] [--sizes 8,32,128]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine  # noqa: E402

STACK = '''
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, offset):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.offset = offset
    def forward(self, x):
        if {single}:  # the add near 256, the sub taking it away: no amplifying op after them
            return 0.5 * x + torch.tanh((x @ self.w + self.offset) - self.offset)
        return 0.5 * x + torch.softmax(x @ self.w + self.offset, dim=-1)

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(256.0 if i == {hot} else 0.0) for i in range({n})])
    def forward(self, x):
        outs = []
        for b in self.blocks:  # every block's output is judged (a tuple is one step's outputs)
            x = b(x)
            outs.append(x)
        return tuple(outs)

def main():
    return Stack()(torch.randn(4, 8))

def faulty(target):
    """offset 0 everywhere, float32; the target on the emulated device with block hot's softmax
    kernel wrong (scaled by 1.5): one culprit op, found with --promote-backend cpu"""
    if not target:
        return Stack()(torch.randn(4, 8))
    from torchparity_backend_emulated import Fault, emulate
    with emulate(faults=[Fault(op="_softmax", module="blocks.{hot}", kind="scale", factor=1.5, step=None)]):
        return Stack()(torch.randn(4, 8))
'''

BENCH_MODEL = '''
import sys
sys.path.insert(0, {bench!r})
from _common import BENCH_CONFIG, toy

def main():
    model = toy.make_model(0, BENCH_CONFIG)
    x, y = toy.make_batches(1, cfg=BENCH_CONFIG)[0]
    return model(x)

def faulty(target):
    """float32; the target on the emulated device with one wrong kernel: layers.1.mlp.down_proj's
    matmul scaled by 1.5 (the demo's planted op)"""
    model = toy.make_model(0, BENCH_CONFIG)
    x, y = toy.make_batches(1, cfg=BENCH_CONFIG)[0]
    if not target:
        return model(x)
    from torchparity_backend_emulated import Fault, emulate
    with emulate(faults=[Fault(op="mm", module="layers.1.mlp.down_proj", kind="scale", factor=1.5, step=None)]):
        return model(x)
'''


def compare_of(script: Path, out: Path) -> Path:
    """The compare of an aten dump of ``main()`` in emulated bf16 against one in fp32 (seed 0 both,
    as the bisect's runs): the output directory ``--compare`` takes."""
    import importlib.util

    import torch

    import torchparity

    spec = importlib.util.spec_from_file_location(script.stem, script)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    for name, backend in (("ref", None), ("bf16", "emulated")):
        torch.manual_seed(0)
        with torchparity.dump(str(out / name), level="aten", **({"backend": backend} if backend else {})):
            mod.main()
    torchparity.compare(str(out / "bf16"), str(out / "ref"), output_dir=str(out / "cmp"))
    return out / "cmp"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/bisect.md"))
    ap.add_argument("--sizes", default="8,32,128")
    args = ap.parse_args()
    import torchparity

    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="tp-bisect-"))
    for single in (False, True):
        for n in [int(s) for s in args.sizes.split(",")]:
            hot = (2 * n) // 3
            script = tmp / f"stack{n}{'_single' if single else ''}.py"
            script.write_text(STACK.format(n=n, hot=hot, single=single))
            t0 = time.perf_counter()
            rep = torchparity.bisect(script, entry="main")
            wall = time.perf_counter() - t0
            # a culprit search: 2 log2 N + 4; a diffuse one stops after 8 culprits: 8 (log2 N + 1) + 1
            target = 2 * math.log2(n) + 4 if rep.verdict != "diffuse" else 8 * (math.ceil(math.log2(n + 1)) + 1) + 1
            short = (lambda xs: "; ".join(xs[:4]) + (f"; ... ({len(xs)} in all)" if len(xs) > 4 else "")) 
            hinted = "-"
            if not single:  # the same bisect given the compare of the two runs (--compare)
                rh = torchparity.bisect(script, entry="main", compare_dir=compare_of(script, tmp / f"cmp{n}"))
                hinted = f"{rh.reruns} ({rh.verdict}, {', '.join(rh.culprit_modules)})"
            rows.append(f"| {n} | {'tanh(add - sub)' if single else 'softmax(add)'} | {hot} | {rep.verdict} | "
                        f"{short([m or '(top level)' for m in rep.culprit_modules]) or '-'} | {short(rep.culprit_ops) or '-'} | "
                        f"{rep.reruns} | {target:.0f} | {'yes' if rep.reruns <= target else 'NO'} | {hinted} | {wall:.1f} s |")
            print(rows[-1], flush=True)
    for n in [int(s) for s in args.sizes.split(",")]:  # one wrong kernel, promoted to the CPU reference
        hot = (2 * n) // 3
        script = tmp / f"stack{n}_fault.py"
        script.write_text(STACK.format(n=n, hot=hot, single=False))
        t0 = time.perf_counter()
        rep = torchparity.bisect(script, entry="faulty", target="native", promote_backend="cpu")
        wall = time.perf_counter() - t0
        target = 2 * math.log2(n) + 4
        rows.append(f"| {n} | softmax kernel fault, `--promote-backend cpu` | {hot} | {rep.verdict} | "
                    f"{', '.join(rep.culprit_modules) or '-'} | {'; '.join(rep.culprit_ops) or '-'} | {rep.reruns} | "
                    f"{target:.0f} | {'yes' if rep.reruns <= target else 'NO'} | - | {wall:.1f} s |")
        print(rows[-1], flush=True)
    script = tmp / "bench_model.py"
    script.write_text(BENCH_MODEL.format(bench=str(ROOT / "bench")))
    t0 = time.perf_counter()
    rep = torchparity.bisect(script, entry="main")
    wall = time.perf_counter() - t0
    bench_line = (f"bench model (TinyLlama BENCH_CONFIG, forward logits, emulated bf16): verdict {rep.verdict}, "
                  f"baseline error {rep.baseline_error:.4g} (tolerance {rep.tolerance}), {rep.runs_total} runs, "
                  f"{rep.reruns} re-runs, wall {wall:.1f} s")
    t0 = time.perf_counter()
    rep = torchparity.bisect(script, entry="faulty", target="native", promote_backend="cpu")
    wall = time.perf_counter() - t0
    fault_line = (f"bench model with a wrong kernel (layers.1.mlp.down_proj's mm x1.5 on the emulated device), "
                  f"`--promote-backend cpu`: verdict {rep.verdict}, culprit op(s) {'; '.join(rep.culprit_ops) or '-'}, "
                  f"{rep.n_modules} modules, {rep.reruns} re-runs (2 log2 N + 4 = {2 * math.log2(rep.n_modules) + 4:.0f}), "
                  f"wall {wall:.1f} s")
    print(bench_line)
    print(fault_line)
    lines = ["# Precision bisect (`bench/bench_bisect.py`)", "",
             f"command: `python bench/bench_bisect.py --sizes {args.sizes}`", "",
             f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             *[f"- {k}: {v}" for k, v in machine().items()], "",
             "Synthetic stacks of N blocks (one module each: `0.5 x + softmax(x @ w + offset)`, or "
             "`0.5 x + tanh((x @ w + offset) - offset)`), block `hot` with offset 256, the others 0; the whole "
             "`main()` (weight init included) runs in emulated bf16 against fp32. Softmax stack: two ops must "
             "both be promoted (the add rounds the logits near 256, and the softmax of them in bf16 is off "
             "too); each culprit op costs its own search. Tanh stack: the hot block's add and sub, plus, on "
             "the longer stacks, the bf16 rounding of every block's weights and activations adding up past the "
             "tolerance -- a divergence with no small culprit set: the search stops after `max_culprits` (8) "
             "units with verdict `diffuse` (before that bound it took 411 re-runs at N = 32 and 6610 at "
             "N = 128). Re-runs count the promoted re-runs (the reference and the baseline run are 2 more). "
             "With `--compare`: the same bisect given the compare of an aten dump of each run (its root "
             "cause's module, then op, tried alone first). Kernel fault: offset 0 everywhere, float32; the "
             "target runs on the emulated device with block `hot`'s softmax kernel wrong (x1.5): one culprit "
             "op, bisected with `--promote-backend cpu` (its ops computed on the CPU reference).", "",
             "| N | block | planted | verdict | culprit modules | culprit ops | re-runs | bound: 2 log2 N + 4 (diffuse: 8 (log2 N + 1) + 1) | within | re-runs with `--compare` | wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "", bench_line, "", fault_line, ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
