"""Session 18's two measurements of the NaN/Inf tracker on bench_launch's launch-bound HF Llama
(hidden 32, 2 layers, batch 4x16, AdamW with foreach=True as on CUDA, 1 thread):

1. the screens' queue on the device path (forced on the CPU, ``_host_read = False``): queues
   flushed per step and screens per step;
2. process CPU time per step, median of 5 interleaved rounds x 20 steps: tool off, steps neither
   tracked nor light (``steps=[0]``), light steps (``steps=[0], light="module"``), every step op
   by op.

``python bench/results/session18/light_and_queue.py``
"""

from __future__ import annotations

import collections
import contextlib
import logging
import statistics
import sys
import time
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torchparity
import torchparity.online.naninf_screens as screens

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
torch.set_num_threads(1)
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, attn_implementation="eager")
model = LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
x = torch.randint(0, 128, (4, 16))


def step() -> None:
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()


def flushes(steps: int = 5) -> tuple[float, float]:
    sizes: collections.Counter = collections.Counter()
    real = screens.ScreenMemo._flush_screens

    def counted(self):  # type: ignore[no-untyped-def]
        sizes[self._queued_n] += 1
        return real(self)

    screens.ScreenMemo._flush_screens = counted  # type: ignore[method-assign]
    try:
        t = torchparity.NanInfTracker(model)
        t._host_read = False
        with t:
            step()
            sizes.clear()
            for _ in range(steps):
                step()
    finally:
        screens.ScreenMemo._flush_screens = real  # type: ignore[method-assign]
    return sum(sizes.values()) / steps, sum(k * v for k, v in sizes.items()) / steps


def cpu_ms(make, n: int = 20) -> float:  # type: ignore[no-untyped-def]
    with make():
        for _ in range(3):
            step()
        t0 = time.process_time()
        for _ in range(n):
            step()
        return (time.process_time() - t0) / n * 1e3


def main() -> int:
    q, v = flushes()
    print(f"device path, foreach AdamW: {q:.1f} queues flushed per step for {v:.0f} screens per step")
    configs = {
        "tool off": contextlib.nullcontext,
        "steps neither tracked nor light (steps=[0])": lambda: torchparity.NanInfTracker(model, steps=[0]),
        "light steps (steps=[0], light='module')": lambda: torchparity.NanInfTracker(model, steps=[0], light="module"),
        "every step op by op": lambda: torchparity.NanInfTracker(model),
    }
    res: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(5):
        for k, make in configs.items():
            res[k].append(cpu_ms(make))
    off = statistics.median(res["tool off"])
    print("| configuration | CPU ms/step | ratio |\n|---|---|---|")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.2f} | {statistics.median(v) / off:.2f}x |")
    print(f"\ntorch {torch.__version__}, Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
