"""Checks on a real CUDA GPU: ``python bench/gpu_checks.py [--out FILE]``.

1. A real ``torchparity.dump`` of the bench model on cuda (aten level, statistics): records,
   devices, statistics read back; losses bitwise equal to a run without the tool.
2. ``NanInfTracker`` on cuda: a NaN planted in one op (a tiny test-local dispatch mode, entered
   outside the tracker like a device would be) is reported at that op; losses bitwise equal
   without a fault; host synchronisations counted with ``torch.cuda.set_sync_debug_mode`` (the
   tracker must sync once per step, never per op).
Prints a markdown report (and writes it to --out).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, machine, model_line  # noqa: E402

import torchparity  # noqa: E402
from torchparity.capture.session import tool_is_busy  # noqa: E402

DEV = "cuda"


class PlantNaN(TorchDispatchMode):
    """Puts a NaN into element 0 of the output of the op the dump would name
    ``Aten.mul.{call}.forward`` in step ``step`` (steps end on optimizer.step())."""

    def __init__(self, call: int, step: int) -> None:
        super().__init__()
        self.call, self.step, self.seen, self.cur = call, step, 0, 0
        self.planted: str | None = None

    def __enter__(self):  # type: ignore[no-untyped-def]
        import torch.optim.optimizer as om

        self._hook = om.register_optimizer_step_post_hook(self._next)
        return super().__enter__()

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        self._hook.remove()
        return super().__exit__(*exc)

    def _next(self, *a):  # type: ignore[no-untyped-def]
        self.cur += 1
        self.seen = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if tool_is_busy():  # the tracker's own computation (like every torchparity mode does)
            return out
        if func.overloadpacket is torch.ops.aten.mul and torch._C._current_graph_task_id() == -1:
            if self.cur == self.step and self.seen == self.call and self.planted is None:
                out.view(-1)[0] = float("nan")  # this mode is outside the tracker: it sees only `out`
                self.planted = f"Aten.mul.{self.call}.forward"
            self.seen += 1
        return out


def losses(bench: Bench, n: int) -> list[float]:
    return [float(bench.step().detach().cpu()) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--cpu", action="store_true", help="run the same checks on the CPU (a dry run of this script)")
    a = ap.parse_args(argv)
    global DEV
    DEV = "cpu" if a.cpu else "cuda"
    if DEV == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    lines = ["# GPU checks (bench/gpu_checks.py)", "", *[f"- {k}: {v}" for k, v in machine().items()], ""]

    # 1. dump on cuda
    ref = losses(Bench(DEV), 3)
    ref2 = losses(Bench(DEV), 3)
    b = Bench(DEV)
    lines.append(f"- Model: {model_line(b)}")
    lines.append(f"- tool off, two fresh runs bitwise equal (cuda determinism control): {ref == ref2}")
    with tempfile.TemporaryDirectory() as d:
        with torchparity.dump(d, level="aten", mode="statistics", model=b.model):
            got = losses(b, 3)
        df = torchparity.load_dump(d)
        devs = sorted(set(df["device"].dropna())) if "device" in df.columns else "?"
        lines += ["", "## 1. torchparity.dump on cuda (aten, statistics, 3 steps)", "",
                  f"- losses bitwise equal to tool off: **{got == ref}** ({got} vs {ref})",
                  f"- rows read back by load_dump: {len(df)}; records: {df['name'].nunique() if 'name' in df else '?'}; "
                  f"steps: {sorted(set(df['step']))}; devices: {devs}",
                  f"- columns: {', '.join(map(str, df.columns[:25]))}"]
        sample = df[df["name"].astype(str).str.startswith("Aten.mm.0.")].head(3) if "name" in df else df.head(3)
        lines += ["", "```", sample.to_string(max_cols=14, max_colwidth=40), "```"]

    # 2. NanInfTracker on cuda
    b = Bench(DEV)
    with torchparity.NanInfTracker(b.model) as t:
        got = losses(b, 3)
    lines += ["", "## 2. NanInfTracker on cuda", "",
              f"- clean run: losses bitwise equal to tool off: **{got == ref}**; findings: {t.findings}"]
    b = Bench(DEV)
    plant = PlantNaN(call=9, step=1)
    with plant:
        with torchparity.NanInfTracker(b.model) as t:
            got = losses(b, 3)
    lines.append(f"- planted NaN at {plant.planted} of step 1 -> findings: "
                 + "; ".join(str(f) for f in t.findings))
    ok = bool(t.first and t.first.name == plant.planted and t.first.step == 1 and len(t.findings) == 1)
    lines.append(f"- culprit named correctly (and nothing else reported): **{ok}**")
    if DEV != "cuda":
        text = "\n".join(lines) + "\n"
        print(text)
        return 0
    # host syncs: warn mode reports every synchronising CUDA call
    b = Bench(DEV)
    b.step()
    torch.cuda.synchronize()
    counts = {}
    for name, make in (("tool off", None), ("NanInfTracker", lambda: torchparity.NanInfTracker(b.model))):
        ctx = make() if make else None
        if ctx:
            ctx.start()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(3):
                    b.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if ctx:
            ctx.stop()
        counts[name] = sum(1 for x in w if "synchroniz" in str(x.message).lower())
    lines.append(f"- host synchronisations in 3 training steps (torch.cuda.set_sync_debug_mode('warn')): "
                 f"tool off {counts['tool off']}, NanInfTracker {counts['NanInfTracker']} "
                 f"(one read per step boundary expected)")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
