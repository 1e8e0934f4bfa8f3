"""Hardware-independent counts of the statistics path: ``python bench/bench_counts.py``.

On the CPU with ``device_stats=True`` (the accelerator path forced), a counting
TorchDispatchMode entered BEFORE the dump (so it sits below the tool's own mode and sees the
tool's ops too) counts every kernel, i.e. every non-view aten op, of a few training steps, once
with the tool off and once under ``torchparity.dump(level=..., mode="statistics")``. The
difference is what the tool launches; divided by the values the dump measured (the statistics
batcher's ``added``) it predicts the per-value launch cost on an accelerator (target <= 2).
Host syncs per step are the tool's ``aten._local_scalar_dense`` (``.item()``) calls and its
copies to the host (``_to_copy``/``copy_`` to the CPU of a tensor that is on the device, and on
the CPU-forced path the flush's explicit host copy): target 1 per flush, 0 per op.

Modes md5 and tensor add each value's copy to the host (capture/host_copies.py): on the forced
path one copy kernel per value into a pool buffer (on an accelerator: a device snapshot, then a
``non_blocking`` copy on a side stream), waited for and hashed/saved by the writer thread. The
table shows the values copied that way, those copied blocking instead (pool full, unsupported
value), and the training thread's blocking host copies per step (target 0 per value).

The NaN/Inf screen is counted the same way on its accelerator path (``_host_read = False``): its
kernels per intercepted op and its scalar reads and host copies per step (target 0 per op; the
table shows 721 reads per step on the HF Llama with the session-10 code, one per op input, which
was 1121 host syncs per step on an H200).

With ``TRITON_INTERPRET=1`` in the environment (and Triton installed) the CPU values take the
CUDA path's one-pass Triton kernel (capture/stat_triton.py) under Triton's interpreter: its
launches are counted with the tool's kernels (a dispatch mode does not see them). Slow (the
interpreter runs each kernel in numpy): use it with ``--models llama``.

Models: the bench model (bench/_common.py, TinyLlama dim 256, batch 8x128) and a small HF Llama
(``transformers.LlamaConfig``, random init). ``--timing`` also times aten+statistics with
device_stats off and on against tool-off on the bench model (what the batched path costs on a CPU).
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import Bench, fmt_ratio, machine, model_line, time_configs  # noqa: E402

import torchparity  # noqa: E402
from torchparity.capture.tool_state import tool_is_busy  # noqa: E402

_SCALAR = torch.ops.aten._local_scalar_dense.default
_NONZERO = torch.ops.aten.is_nonzero.default  # bool(tensor): a scalar read too
_TO = (torch.ops.aten._to_copy, torch.ops.aten.to)
_COPY = torch.ops.aten.copy_.default
_EMPTY = (torch.ops.aten.empty, torch.ops.aten.empty_strided)  # allocations: counted, but no launch


_IN_INTERPRETER = [0]  # inside a Triton launch run by the interpreter (its own torch copies are not the tool's)


def _count_triton_launches_only() -> None:
    """Under TRITON_INTERPRET=1 the interpreter copies a kernel's tensor arguments with torch ops:
    those are not kernels of the tool on a GPU, where the launch is one kernel (counted apart)."""
    import os

    from torchparity.capture import stat_triton

    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    launch = stat_triton._launch

    def counted(*args: Any) -> None:
        _IN_INTERPRETER[0] += 1
        try:
            launch(*args)
        finally:
            _IN_INTERPRETER[0] -= 1

    stat_triton._launch = counted


class Counter(TorchDispatchMode):
    """Counts kernels (non-view aten ops), scalar reads and copies to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = self.busy_kernels = self.scalars = self.to_host = self.allocs = 0
        self.busy_scalars = self.busy_to_host = 0  # of the tool's own work (tool_is_busy())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _IN_INTERPRETER[0]:
            return func(*args, **kwargs)
        if not func.is_view:
            self.kernels += 1
            if tool_is_busy():
                self.busy_kernels += 1
                if func.overloadpacket in _EMPTY:
                    self.allocs += 1
        if func is _SCALAR or func is _NONZERO:
            self.scalars += 1
            self.busy_scalars += tool_is_busy()
        elif func.overloadpacket in _TO and _to_cpu(args, kwargs) \
                and (tool_is_busy() or args[0].device.type != "cpu"):  # on the CPU-forced path: the tool's host copy
            self.to_host += 1
            self.busy_to_host += tool_is_busy()
        elif func is _COPY and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            self.to_host += 1
            self.busy_to_host += tool_is_busy()
        return func(*args, **kwargs)


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    """``_to_copy``/``to`` with a CPU target device (a composite ``to`` is seen under some modes)."""
    dev = kwargs.get("device")
    if dev is None:
        dev = next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
    return dev is not None and torch.device(dev).type == "cpu"


class _Llama:
    """A small HF Llama (random init) with the bench's step: forward, loss, backward, AdamW."""

    def __init__(self) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        cfg._attn_implementation = "eager"
        self.model = LlamaForCausalLM(cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randint(0, 256, (2, 32))
        n = sum(p.numel() for p in self.model.parameters())
        self.line = f"HF LlamaForCausalLM hidden 64, 2 layers, batch 2x32, {n / 1e6:.2f} M parameters, eager attention"

    def step(self) -> torch.Tensor:
        out = self.model(input_ids=self.inputs, labels=self.inputs)
        out.loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return out.loss


def _count(step: Callable[[], Any], model: torch.nn.Module, level: str | None, steps: int,
           mode: str = "statistics") -> dict[str, Any]:
    """Counts over ``steps`` steps (after one step outside the counter), tool off when level is None."""
    root = tempfile.mkdtemp(prefix="tp-counts-")
    try:
        dumper = None
        if level is not None:
            dumper = torchparity.dump(root, level=level, mode=mode, device_stats=True, model=model)
        with Counter() as c:
            if dumper is not None:
                dumper.start()
            for _ in range(steps):
                step()
            if dumper is not None:
                dumper.stop()
        out: dict[str, Any] = {"kernels": c.kernels, "busy_kernels": c.busy_kernels, "scalars": c.scalars,
                               "to_host": c.to_host, "allocs": c.allocs}
        if dumper is not None:
            b = dumper.session._batcher  # type: ignore[union-attr]
            cp = dumper.session._copier  # type: ignore[union-attr]
            out.update(added=b.added, flushes=b.flushes, entries=_entries(Path(root)), copies=cp.copies,
                       declined=cp.declined, triton=b.kernel_launches)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _entries(root: Path) -> int:
    """Tensor entries with statistics in the dump (measured values and reused measurements)."""
    import json

    n = 0
    for f in root.glob("step*/rank*/records.jsonl"):
        for line in f.read_text().splitlines():
            n += sum(1 for t in json.loads(line).get("tensors", []) if t.get("stats"))
    return n


def counts_table(models: dict[str, tuple[Callable[[], Any], torch.nn.Module, str]], levels: list[str],
                 steps: int, modes: tuple[str, ...] = ("statistics",)) -> str:
    rows = ["| model | level | mode | tool kernels | of which Triton | values measured | entries with stats "
            "| tool kernels / value | flushes / step | host copies / step | `.item()` / step | values copied async "
            "| copied blocking | tool allocations |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (step, model, _) in models.items():
        step()  # warm-up: lazy initialisation is not the tool's
        off = _count(step, model, None, steps)
        for level in levels:
            for mode in modes:
                on = _count(step, model, level, steps, mode)
                tool = on["kernels"] - off["kernels"] + on["triton"]  # Triton launches are not torch ops
                rows.append(f"| {name} | {level} | {mode} | {tool} | {on['triton']} | {on['added']} | {on['entries']} | "
                            f"{tool / max(on['added'], 1):.2f} | {on['flushes'] / steps:.1f} | "
                            f"{(on['to_host'] - off['to_host']) / steps:.1f} | "
                            f"{(on['scalars'] - off['scalars']) / steps:.1f} | {on['copies']} | {on['declined']} | {on['allocs']} |")
                print(rows[-1], flush=True)
    return "\n".join(rows)


def timing_table(rounds: int, steps: int) -> str:
    bench = Bench("cpu")

    def cfg(device_stats: bool) -> Callable[[], Any]:
        class _D:
            def __enter__(self) -> None:
                self.dir = tempfile.mkdtemp(prefix="tp-counts-")
                self.d = torchparity.dump(self.dir, level="aten", mode="statistics", device_stats=device_stats,
                                          model=bench.model).start()

            def __exit__(self, *exc: object) -> None:
                self.d.stop()

            def cleanup(self) -> None:
                shutil.rmtree(self.dir, ignore_errors=True)
        return _D

    t = time_configs(bench, {"tool off": None, "aten+statistics": cfg(False),
                             "aten+statistics device_stats": cfg(True)}, rounds=rounds, warmup=1, steps=steps)
    base = t["tool off"]
    lines = [f"{model_line(bench)}", "", "| configuration | ms/step | ratio |", "|---|---|---|"]
    for name, tm in t.items():
        lines.append(f"| {name} | {tm.median * 1000:.1f} | {fmt_ratio(tm, base)} |")
    return "\n".join(lines)


def compiled_counts(steps: int) -> str:
    """The compiled capture's accelerator path (``compile_backend(device_stats=True)``, Inductor) on
    the bench model: values measured, kernels the statistics launch (the batcher's staging copies
    and flushes, seen by a :class:`Counter` entered inside them: a mode around the step would keep
    Dynamo from compiling), scalar reads and host transfers per step."""
    import tempfile

    from torchparity.capture.stat_batch import StatBatcher

    b = Bench("cpu")
    counter = Counter()
    values = [0]
    real_add, real_flush = StatBatcher.add, StatBatcher.flush

    def add(self: StatBatcher, v: torch.Tensor) -> Any:
        values[0] += 1
        with counter:
            return real_add(self, v)

    def flush(self: StatBatcher) -> None:
        with counter:
            real_flush(self)

    cap = torchparity.compile_backend(tempfile.mkdtemp(), inner="inductor", device_stats=True)
    cap.attach(b.opt)
    b.model = torch.compile(b.model, backend=cap)
    b.step()  # compile, and the first step
    StatBatcher.add, StatBatcher.flush = add, flush  # type: ignore[method-assign]
    try:
        t0 = cap.transfers
        for _ in range(steps):
            b.step()
    finally:
        StatBatcher.add, StatBatcher.flush = real_add, real_flush  # type: ignore[method-assign]
        cap.close()
    n = max(values[0], 1)
    kernels = counter.kernels - counter.allocs
    return ("| model | values/step | tool kernels/value | scalar reads/step | host transfers/step |\n|---|---|---|---|---|\n"
            f"| bench model, compiled (Inductor) | {values[0] / steps:.0f} | {kernels / n:.2f} | "
            f"{counter.scalars / steps:.0f} | {(cap.transfers - t0) / steps:.0f} |")


def naninf_table(models: dict[str, tuple[Callable[[], Any], torch.nn.Module, str]], steps: int) -> str:
    """The NaN/Inf screen on its accelerator path run on the CPU (``_host_read = False``: screens
    stay device tensors until the step's fold, as on CUDA): the tool's kernels per intercepted op,
    and its scalar reads and host copies per step (each is a host sync on an accelerator: target
    1 per step, the fold's read, which is a ``.tolist()`` and so not an aten op: 0 here)."""
    from torchparity.capture.op_stream import op_stream

    rows = ["| model | ops intercepted / step | tool kernels / op | tool scalar reads / step "
            "| tool host copies / step |", "|---|---|---|---|---|"]
    for name, (step, model, _) in models.items():
        step()
        tracker = torchparity.NanInfTracker(model)
        tracker._host_read = False
        with Counter() as c:
            with tracker:
                step()  # the tracker's first step (its tables are made) is not counted
                k0, s0, h0, n0 = c.busy_kernels, c.busy_scalars, c.busy_to_host, op_stream().intercepted
                for _ in range(steps):
                    step()
                k1, s1, h1, n1 = c.busy_kernels, c.busy_scalars, c.busy_to_host, op_stream().intercepted
        ops = max(n1 - n0, 1)
        rows.append(f"| {name} | {ops / steps:.0f} | {(k1 - k0) / ops:.2f} | {(s1 - s0) / steps:.1f} "
                    f"| {(h1 - h0) / steps:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bench,llama", help="comma list: bench, llama")
    ap.add_argument("--levels", default="module,api,aten", help="comma list of dump levels")
    ap.add_argument("--modes", default="statistics", help="comma list of dump modes: statistics, md5, tensor")
    ap.add_argument("--steps", type=int, default=2, help="steps counted per configuration")
    ap.add_argument("--timing", action="store_true", help="also time aten+statistics, device_stats off/on")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (with --timing)")
    ap.add_argument("--compiled", action="store_true",
                    help="only the compiled capture's accelerator path (compile_backend(device_stats=True))")
    a = ap.parse_args(argv)
    _count_triton_launches_only()
    if a.compiled:
        print(f"machine: {machine()}\n\nCompiled capture, per step over {a.steps} steps, device_stats=True on the CPU:\n")
        print(compiled_counts(a.steps))
        return 0
    torch.manual_seed(0)
    models: dict[str, tuple[Callable[[], Any], torch.nn.Module, str]] = {}
    for m in a.models.split(","):
        if m == "bench":
            b = Bench("cpu")

            def bench_step(b: Bench = b) -> Any:
                return b.step()
            models["bench model"] = (bench_step, b.model, model_line(b))
        elif m == "llama":
            ll = _Llama()
            models["HF Llama"] = (ll.step, ll.model, ll.line)
        else:
            ap.error(f"--models: unknown model {m!r}; use bench, llama")
    print(f"machine: {machine()}")
    for name, (_, _, line) in models.items():
        print(f"{name}: {line}")
    modes = tuple(a.modes.split(","))
    bad = set(modes) - {"statistics", "md5", "tensor"}
    if bad:
        ap.error(f"--modes: unknown mode(s) {sorted(bad)}; use statistics, md5, tensor")
    print(f"\nCounts per {a.steps} steps, device_stats=True on the CPU:\n")
    print(counts_table(models, a.levels.split(","), a.steps, modes))
    print(f"\nNaN/Inf screen, device path on the CPU, per {a.steps} steps:\n")
    print(naninf_table(models, a.steps))
    if a.timing:
        print("\nCPU cost of the batched path (aten + statistics):\n")
        print(timing_table(a.rounds, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
