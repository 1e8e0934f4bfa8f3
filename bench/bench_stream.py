"""Every consumer of the op stream, alone and together: ``python bench/bench_stream.py``.

Times forward + backward + AdamW with the tool off, an empty TorchDispatchMode (the floor of any
dispatch-mode tool), the NaN/Inf screen, the dump at each level with statistics, and the dump +
NaN/Inf screen (+ online compare with ``--online``) running together, all in this process,
interleaved (see ``bench/_common.py``). "Together" should cost one interception plus each
consumer's own work, not the sum of separate tools: the table shows the sum of the separate
overheads beside it. Models: ``bench`` (the 4 M-parameter bench TinyLlama) and ``llama100m``
(a ~100 M-parameter Hugging Face ``LlamaConfig``, random init, batch 1 x 128; needs transformers).
Writes bench/results/stream.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, Syncs, fmt_ratio, machine, model_line, time_configs  # noqa: E402

import torchparity  # noqa: E402


class EmptyMode(TorchDispatchMode):
    """Calls every kernel unchanged: the cost of the dispatch-mode machinery alone."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


class LlamaBench(Syncs):
    """A ~100 M-parameter HF Llama (random init), same interface as :class:`_common.Bench`."""

    def __init__(self, device: str = "cpu", hidden: int = 768, layers: int = 8, seq: int = 128,
                 batch: int = 1, dtype: torch.dtype = torch.float32) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        self.cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                               num_hidden_layers=layers, num_attention_heads=hidden // 64,
                               num_key_value_heads=hidden // 64, max_position_embeddings=seq,
                               attn_implementation="eager")
        self.device = torch.device(device)
        with self.device:  # random init on the device itself (a 1 B model's CPU init takes a minute)
            self.model = LlamaForCausalLM(self.cfg).to(dtype)
        self.dtype = dtype
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, self.cfg.vocab_size, (batch, seq), generator=g).to(self.device)
        self.batch, self.seq = batch, seq

    def step(self) -> torch.Tensor:
        logits = self.model(input_ids=self.ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), self.ids[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss

    def line(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        c = self.cfg
        return (f"HF LlamaForCausalLM (eager attention, random init) hidden={c.hidden_size} "
                f"intermediate={c.intermediate_size} layers={c.num_hidden_layers} heads={c.num_attention_heads} "
                f"vocab={c.vocab_size}, batch {self.batch}x{self.seq} tokens, {n / 1e6:.1f} M parameters, "
                f"{str(self.dtype).replace('torch.', '')}, "
                f"forward + cross-entropy + backward + AdamW, device {self.device}")


class _Tools:
    """Runs several tools as one context (entered in order, left in reverse)."""

    def __init__(self, root: str, bench: Any, dump_level: str | None, naninf: bool, online: bool,
                 mode: str = "statistics", summaries: str = "off", naninf_light: bool = False) -> None:
        self.dir = tempfile.mkdtemp(dir=root)
        self.stack = contextlib.ExitStack()
        self.parts: list[Any] = []
        if dump_level is not None:
            self.parts.append(lambda: torchparity.dump(self.dir, level=dump_level, mode=mode, model=bench.model,
                                                       summaries=summaries))
        if naninf:
            # light: step 0 (a warm-up step) tracked op by op, the timed steps are light steps
            kw: dict[str, Any] = dict(steps=[0], light="module") if naninf_light else {}
            self.parts.append(lambda: torchparity.NanInfTracker(bench.model, **kw))
        if online:
            from torchparity.online.compare import CompareWithReference

            self.parts.append(lambda: CompareWithReference(reference="cpu", model=bench.model))

    def __enter__(self) -> "_Tools":
        for make in self.parts:
            self.stack.enter_context(make())
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()

    def cleanup(self) -> None:  # called by time_configs after the clock stopped
        shutil.rmtree(self.dir, ignore_errors=True)


def _syncs_per_step(bench: Any, make: Any) -> str:
    """Host synchronisations in one step with this configuration, counted by
    ``torch.cuda.set_sync_debug_mode("warn")`` (n/a off CUDA)."""
    if bench.device.type != "cuda":
        return "n/a"
    import warnings

    ctx = make() if make is not None else contextlib.nullcontext()
    with ctx:
        bench.step()
        bench.sync()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                bench.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        bench.sync()
    if hasattr(ctx, "cleanup"):
        ctx.cleanup()
    return str(sum("synchroniz" in str(w.message) for w in caught))


def _intercepted_per_step(bench: Any, make: Any) -> str:
    """Ops the op stream intercepted in one step with this configuration (n/a before the stream)."""
    try:
        from torchparity.capture.op_stream import op_stream
    except ImportError:
        return "n/a"
    s = op_stream()
    ctx = make()
    with ctx:
        bench.step()
        n0 = s.intercepted
        bench.step()
        n1 = s.intercepted
    if hasattr(ctx, "cleanup"):
        ctx.cleanup()
    return str(n1 - n0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python bench/bench_stream.py --model bench --rounds 5")
    ap.add_argument("--model", default="bench", choices=["bench", "llama100m", "llama1b", "quick"],
                    help="bench (4 M TinyLlama, default), llama100m (HF Llama ~100 M, batch 1x128), "
                         "llama1b (HF Llama ~1 B, batch 1x1024: for a GPU), quick (smoke test)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="parameter dtype of the HF Llama models (default float32)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--batch", type=int, default=1,
                    help="sequences per step of the HF Llama models (default 1; more makes a GPU step device-bound)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps after starting the tools (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round (default 2)")
    ap.add_argument("--levels", default="module,api,aten,mix", help="dump levels to time alone (default all four)")
    ap.add_argument("--modes", default="statistics", help="dump modes to time at each level (default statistics; "
                    "md5, tensor: tensor mode writes every captured value to disk)")
    ap.add_argument("--summaries", default="off", choices=["step", "close", "off"],
                    help="the dumps' Parquet summaries (default off, as torchparity.dump's: none while training; "
                         "step: built by the writer thread at each step's end, in the training thread's GIL time)")
    ap.add_argument("--online", action="store_true",
                    help="also time online compare against the CPU reference (re-runs every op: costly by design)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "stream.md"),
                    help="results file (default bench/results/stream.md)")
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    if a.model == "llama100m":
        bench: Any = LlamaBench(a.device, batch=a.batch, dtype=dtype)
    elif a.model == "llama1b":
        bench = LlamaBench(a.device, hidden=2048, layers=16, seq=1024, batch=a.batch, dtype=dtype)
    else:
        bench = Bench(a.device, quick=a.model == "quick")
    line = bench.line() if isinstance(bench, LlamaBench) else model_line(bench)
    root = tempfile.mkdtemp(prefix="tp-bench-stream-")

    def tools(level: str | None, naninf: bool = False, online: bool = False, mode: str = "statistics",
              light: bool = False) -> Any:
        return lambda: _Tools(root, bench, level, naninf, online, mode, a.summaries, naninf_light=light)

    configs: dict[str, Any] = {"tool off": None, "empty TorchDispatchMode": EmptyMode,
                               "NaN/Inf screen": tools(None, naninf=True),
                               "NaN/Inf light steps": tools(None, naninf=True, light=True)}
    for mode in [x for x in a.modes.split(",") if x]:
        for level in [x for x in a.levels.split(",") if x]:
            configs[f"dump {level}" + ("" if mode == "statistics" else f" {mode}")] = tools(level, mode=mode)
    configs["dump aten + NaN/Inf"] = tools("aten", naninf=True)
    if a.online:
        configs["online compare"] = tools(None, online=True)
        configs["dump aten + NaN/Inf + online"] = tools("aten", naninf=True, online=True)
    print(line, flush=True)
    try:
        res = time_configs(bench, configs, rounds=a.rounds, warmup=a.warmup, steps=a.steps)
        counts = {name: _intercepted_per_step(bench, make) for name, make in configs.items() if make is not None}
        syncs = {name: _syncs_per_step(bench, make) for name, make in configs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = res["tool off"]

    def over(name: str) -> float:
        return res[name].median / base.median - 1.0

    lines = [
        "# The op stream: its consumers alone and together",
        "",
        f"Command: `python bench/bench_stream.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        "",
        f"- Model: {line}",
        *[f"- {k}: {v}" for k, v in machine().items()],
        f"- Load average before: {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "",
        f"- Protocol: {a.rounds} interleaved rounds x ({a.warmup} warm-up + {a.steps} timed steps); median per-step "
        "time; ratio = median / tool-off median in the same process. Dumps at statistics mode unless named.",
        "",
        "| configuration | ms/step (median) | ratio vs tool off | ops intercepted per step | host syncs per step |",
        "|---|---|---|---|---|",
    ]
    for name, t in res.items():
        lines.append(f"| {name} | {t.median * 1000:.1f} | {fmt_ratio(t, base)} | {counts.get(name, '-')} "
                     f"| {syncs.get(name, '-')} |")
    together = [("dump aten + NaN/Inf", ["dump aten", "NaN/Inf screen"])]
    if a.online:
        together.append(("dump aten + NaN/Inf + online", ["dump aten", "NaN/Inf screen", "online compare"]))
    lines += ["", "| together | overhead together | sum of the separate overheads |", "|---|---|---|"]
    for name, parts in together:
        if all(p in res and not res[p].error for p in parts + [name]):  # (--levels without aten: no row)
            lines.append(f"| {name} | {over(name):+.2f} | {sum(over(p) for p in parts):+.2f} |")
    lines.append("")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(x for x in lines if x is not None))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
