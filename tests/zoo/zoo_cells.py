"""The zoo's cells: one feature of torchparity run on one model and judged automatically.

A cell returns a :class:`Cell`: ``OK``, ``false alarm`` (the tool reported a problem on a clean
run, or could not conclude where it should), ``miss`` (a planted fault was not named, or named
wrongly), ``crash`` (an exception escaped the tool; a process abort is caught by the runner, which
runs every cell in its own subprocess) or ``n/a`` (the cell does not apply: no aten softmax in an
sdpa model, no float16 LSTM on the CPU), with a short note saying what was reported.

Faults are planted with the emulated backend's fault injection (``torchparity_backend_emulated``,
a dispatch mode entered *outside* the tool, full precision: ``dtype=None``) on top of a real
low-precision run: a dry run with a ``scale x1`` fault lists where the pattern fires, and the
first firing (op, module, phase, call) is then perturbed alone.
"""

from __future__ import annotations

import contextlib

import math
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from zoo_models import ZOO, Trainer, ZooSpec  # noqa: I001  (tests/zoo is on sys.path)

OK, FALSE_ALARM, MISS, CRASH, NA = "OK", "false alarm", "miss", "crash", "n/a"
LEVELS = ("module", "api", "aten", "mix")


@dataclass
class Cell:
    """The verdict of one model x feature cell."""

    status: str
    note: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NotApplicable(Exception):
    """The cell does not apply to this model (the message says why)."""


def _short(text: Any, n: int = 220) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _trainer(spec: ZooSpec, precision: str) -> Trainer:
    if precision in spec.unsupported:
        raise NotApplicable(spec.unsupported[precision])
    return Trainer(spec, precision)


# ---- dumps and compare -----------------------------------------------------------------------

def _dump(spec: ZooSpec, precision: str, path: Path, steps: int = 1, faults: list[Any] | None = None,
          extra_clone: bool = False, **options: Any) -> list[Any]:
    """Dump ``steps`` training steps; returns the emulated device's injections (faults given)."""
    import torchparity

    tr = _trainer(spec, precision)
    handles = _extra_clone(tr.model, spec.mlp_module) if extra_clone else []
    if faults:
        from torchparity_backend_emulated import emulate

        with emulate(dtype=None, faults=faults) as dev:
            with torchparity.dump(str(path), model=tr.model, **options):
                tr.train(steps)
        injections = list(dev.injections)
    else:
        with torchparity.dump(str(path), model=tr.model, **options):
            tr.train(steps)
        injections = []
    for h in handles:
        h.remove()
    return injections


def _extra_clone(model: torch.nn.Module, module: str) -> list[Any]:
    """One extra op in the device's backward: the gradient of ``module``'s output is cloned."""
    def fwd_hook(_m: Any, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: g.clone())

    return [model.get_submodule(module).register_forward_hook(fwd_hook)]


def _describe(res: Any) -> str:
    rc = res.root_cause
    if rc is not None:
        return _short(f"root cause {rc.name} ({rc.op}) in {rc.module or '-'!r}, {rc.phase}, step {rc.step}: "
                      f"{rc.reason}")
    s = res.summary
    if not res.complete:
        return _short(f"incomplete: {s.get('incomplete_reason') or s.get('warnings') or s}")
    rows = res.rows
    first = ""
    if len(rows) and "verdict" in rows.columns:
        err = rows[rows["verdict"] == "error"]
        if len(err):
            r = err.iloc[0]
            first = f"; first {r.get('device_name')} {r.get('tensor')} in {r.get('module') or '-'!r}: {r.get('reason')}"
    return _short(f"no root cause, {s.get('n_error', 0)} error rows{first}")


def _compare(dev: Path, bench: Path) -> Any:
    import torchparity

    return torchparity.compare(str(dev), str(bench))


def dump_identity(level: str, mode: str = "statistics", precision: str = "fp32",
                  b_options: dict[str, Any] | None = None) -> Callable[[ZooSpec, Path], Cell]:
    """Two identical clean runs dumped at ``level``/``mode`` compare as agreeing and complete
    (``b_options``: extra dump options of the second run, e.g. the batched device statistics)."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        for tag in ("a", "b"):
            _dump(spec, precision, wd / tag, level=level, mode=mode, **((b_options or {}) if tag == "b" else {}))
        res = _compare(wd / "a", wd / "b")
        if res.diverged or not res.complete:
            return Cell(FALSE_ALARM, _describe(res))
        return Cell(OK, f"{len(res.rows)} rows agree")
    return cell


def lowp_clean(precision: str, level: str, steps: int = 1) -> Callable[[ZooSpec, Path], Cell]:
    """A clean low-precision run against its fp32 reference: no root cause, no error row."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        _dump(spec, precision, wd / "dev", level=level, steps=steps)
        _dump(spec, "fp32", wd / "bench", level=level, steps=steps)
        res = _compare(wd / "dev", wd / "bench")
        if res.diverged or not res.complete:
            return Cell(FALSE_ALARM, _describe(res))
        return Cell(OK, f"{len(res.rows)} rows, no root cause")
    return cell


def fp16_scaler_overflow(level: str) -> Callable[[ZooSpec, Path], Cell]:
    """An fp16-AMP run whose GradScaler starts at 2**24 (its backward overflows, the scaler skips
    the step) against the fp32 run: no root cause, no error row; the backward is said not
    compared (an incomplete comparison, not a divergence)."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        import torchparity

        tr = _trainer(spec, "fp16")
        tr.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
        with torchparity.dump(str(wd / "dev"), model=tr.model, level=level):
            tr.train(1)
        skipped = tr.scaler.get_scale() < 2.0 ** 24
        _dump(spec, "fp32", wd / "bench", level=level)
        res = _compare(wd / "dev", wd / "bench")
        if res.diverged:
            return Cell(FALSE_ALARM, _describe(res))
        said = any("GradScaler" in w and "not compared" in w for w in res.summary["warnings"])
        if skipped and not said:
            return Cell(FALSE_ALARM, "the scaler skipped the step and the compare did not say so")
        return Cell(OK, f"no root cause; the scaler {'skipped (said)' if skipped else 'did not skip'}; "
                        f"{res.summary['n_not_compared']} rows not compared")
    return cell


_FAULT_SITES = {  # where -> (op pattern, ZooSpec attribute of the module, phase)
    "fwd-mm": ("aten.*mm", "fwd_module", "forward"),
    "bwd-mm": ("aten.*mm", "bwd_module", "backward"),
    "softmax": ("aten._*softmax", "softmax_module", "forward"),  # _softmax, _safe_softmax (T5)
}


def _pin(spec: ZooSpec, precision: str, op: str, module: str, phase: str, wd: Path, **fault_kw: Any) -> Any:
    """The first op matching (op, module, phase) in step 0, as a Fault pinned to its call index."""
    from torchparity_backend_emulated import Fault, emulate

    tr = _trainer(spec, precision)
    with emulate(dtype=None, faults=[Fault(op=op, module=module, phase=phase, call=None, step=0,
                                           kind="scale", factor=1.0)]) as dev:
        tr.train(1)
    if not dev.injections:
        raise RuntimeError(f"harness: no {op} in {module!r} ({phase}) fired in a dry run")
    inj = dev.injections[0]
    return Fault(op=inj.op, module=inj.module, phase=phase, call=inj.call, step=0, **fault_kw)


def planted_fault(where: str, factor: float, precision: str = "bf16", level: str = "aten",
                  extra_clone: bool = False) -> Callable[[ZooSpec, Path], Cell]:
    """One op of the low-precision run scaled by ``factor``: the root cause names op, module, phase."""
    op, attr, phase = _FAULT_SITES[where]

    def cell(spec: ZooSpec, wd: Path) -> Cell:
        module = getattr(spec, attr)
        if module is None:
            raise NotApplicable(f"no aten softmax in {spec.name} (fused attention)")
        fault = _pin(spec, precision, op, module, phase, wd, kind="scale", factor=factor)
        inj = _dump(spec, precision, wd / "dev", level=level, faults=[fault], extra_clone=extra_clone)
        _dump(spec, "fp32", wd / "bench", level=level)
        if len(inj) != 1:
            raise RuntimeError(f"harness: the fault fired {len(inj)} times")
        planted = f"{inj[0].op} call {inj[0].call} in {inj[0].module!r}, {inj[0].phase}"
        res = _compare(wd / "dev", wd / "bench")
        rc = res.root_cause
        if rc is None:
            return Cell(MISS, _short(f"planted {planted}; {_describe(res)}"))
        base = inj[0].op.split(".")[1]  # aten.mm.default -> mm
        op_ok = level != "aten" or rc.op.split(".")[1:2] == [base]
        if rc.module == inj[0].module and rc.phase == inj[0].phase and rc.step == 0 and op_ok:
            return Cell(OK, _short(f"{rc.name} in {rc.module!r}, {rc.phase}"))
        return Cell(MISS, _short(f"planted {planted}; got {_describe(res)}"))
    return cell


# ---- NaN/Inf tracker -------------------------------------------------------------------------

def _track(tr: Trainer, steps: int) -> tuple[Any, list[float]]:
    """Train ``steps`` steps under a NanInfTracker; returns the tracker and the losses."""
    import torchparity

    with torchparity.NanInfTracker(tr.model, on_failure="log") as tracker:
        losses = tr.train(steps)
    return tracker, losses


def naninf_clean(precision: str = "fp32") -> Callable[[ZooSpec, Path], Cell]:
    """The tracker on a clean model, 2 steps: no finding."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        tracker, _ = _track(_trainer(spec, precision), 2)
        if tracker.findings:
            return Cell(FALSE_ALARM, _short("; ".join(str(f) for f in tracker.findings)))
        return Cell(OK, "no finding")
    return cell


def naninf_light_clean(precision: str = "fp32") -> Callable[[ZooSpec, Path], Cell]:
    """The tracker's light tier on a clean model: step 0 op by op, steps 1-2 light; no finding."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        import torchparity

        tr = _trainer(spec, precision)
        with torchparity.NanInfTracker(tr.model, on_failure="log", steps=[0], light="module") as tracker:
            tr.train(3)
        if tracker.findings:
            return Cell(FALSE_ALARM, _short("; ".join(str(f) for f in tracker.findings)))
        return Cell(OK, "no finding (1 step op by op, 2 light steps)")
    return cell


def naninf_scaler_overflow(light: bool) -> Callable[[ZooSpec, Path], Cell]:
    """fp16 AMP with a GradScaler started at 2**24, as high as real runs start theirs: the scaled
    backward overflows in the first steps and the scaler skips them, by design. The tracker (op by
    op over 3 steps, or step 0 op by op and the rest light, each step ended by hand since skipped
    optimizer steps end none) reports nothing."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        import torchparity

        tr = _trainer(spec, "fp16")
        tr.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
        kw: dict[str, Any] = dict(steps=[0], light="module") if light else {}
        with torchparity.NanInfTracker(tr.model, on_failure="log", **kw) as tracker:
            for _ in range(3):
                tr.step()
                tracker.step()
        skipped = tr.scaler.get_scale() < 2.0 ** 24
        if tracker.findings:
            return Cell(FALSE_ALARM, _short("; ".join(str(f) for f in tracker.findings)))
        return Cell(OK, f"no finding; the scaler {'skipped overflowing steps' if skipped else 'skipped no step'}, "
                        f"{len(tracker.absorbed)} absorbed")
    return cell


def naninf_light_dispatch(spec: ZooSpec, wd: Path) -> Cell:
    """A NaN put into one forward op on light step 1: the light finding names that step and the
    module (or one inside it, or around it: the first module output that held the NaN)."""
    import dataclasses

    import torchparity
    from torchparity_backend_emulated import emulate

    fault = dataclasses.replace(_pin(spec, "fp32", spec.nan_op, spec.nan_module, "forward", wd, kind="nan", index=3),
                                step=1)
    tr = _trainer(spec, "fp32")
    with emulate(dtype=None, faults=[fault]) as dev:
        with torchparity.NanInfTracker(tr.model, on_failure="log", steps=[0], light="module") as tracker:
            losses = tr.train(2)
    if not dev.injections:
        raise RuntimeError("harness: the fault did not fire in step 1")
    mod = dev.injections[0].module
    for f in tracker.findings:
        if f.kind == "light" and f.step == 1 and f.phase == "forward" and (
                f.module == mod or f.module.startswith(mod + ".") or mod.startswith(f.module + ".") or not mod):
            return Cell(OK, _short(f"light: {f.name} (planted in {mod!r})"))
    got = "; ".join(str(f) for f in tracker.findings) or f"no finding (loss {losses})"
    return Cell(MISS, _short(f"planted NaN in {dev.injections[0].op} in {mod!r} at step 1; got {got}"))


def _judge_nan(tracker: Any, module: str, op_ok: Callable[[str], bool], planted: str, losses: list[float]) -> Cell:
    for f in tracker.findings:
        if f.module == module and op_ok(f.op):
            return Cell(OK, _short(f"{f.kind}: {f.name} ({f.op}) in {f.module!r}"))
    got = "; ".join(str(f) for f in tracker.findings) or f"no finding (loss {losses})"
    return Cell(MISS, _short(f"planted {planted}; got {got}"))


def naninf_dispatch(spec: ZooSpec, wd: Path) -> Cell:
    """A NaN put into one forward op by a dispatch mode outside the tracker: the finding names it."""
    from torchparity_backend_emulated import emulate

    fault = _pin(spec, "fp32", spec.nan_op, spec.nan_module, "forward", wd, kind="nan", index=3)
    tr = _trainer(spec, "fp32")
    with emulate(dtype=None, faults=[fault]) as dev:
        tracker, losses = _track(tr, 1)
    inj = dev.injections[0]
    planted = f"NaN in {inj.op} in {inj.module!r}"
    base = inj.op.rsplit(".", 1)[0]
    return _judge_nan(tracker, inj.module, lambda op: op.startswith(base), planted, losses)


def naninf_hook(kind: str) -> Callable[[ZooSpec, Path], Cell]:
    """A forward hook on ``hook_module`` writes a NaN: ``write`` is ``out[..., 3] = nan`` on a clone
    of the output (an in-place write; the clone keeps autograd's saved tensors intact), ``mul``
    returns ``out * nan``. The finding must be in the hooked module (for ``write``: at the write)."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        tr = _trainer(spec, "fp32")

        def hook(_m: Any, _i: Any, out: torch.Tensor) -> torch.Tensor:
            if kind == "mul":
                return out * float("nan")
            out = out.clone()
            out[..., 3] = float("nan")
            return out

        h = tr.model.get_submodule(spec.hook_module).register_forward_hook(hook)
        try:
            import torchparity

            with torchparity.NanInfTracker(tr.model, on_failure="log") as tracker:
                losses = tr.train(1)
        finally:
            h.remove()
        if kind == "mul":
            return _judge_nan(tracker, spec.hook_module, lambda op: "mul" in op, "out * nan in a forward hook", losses)
        writes = ("fill_", "copy_", "index_put", "masked_fill", "select_scatter", "slice_scatter")
        return _judge_nan(tracker, spec.hook_module, lambda op: any(w in op for w in writes),
                          "out[..., 3] = nan in a forward hook", losses)
    return cell


# ---- online compare, gradients, graph, bitwise -----------------------------------------------

def online(precision: str = "bf16") -> Callable[[ZooSpec, Path], Cell]:
    """CompareWithReference of the low-precision model against the CPU: no failure, no crash."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        import torchparity

        tr = _trainer(spec, precision)
        with torchparity.CompareWithReference(reference="cpu", model=tr.model, on_failure="log") as c:
            tr.train(1)
        if c.failures:
            f = c.failures[0]
            return Cell(FALSE_ALARM, _short(f"{len(c.failures)} failures of {c.checked} checked; first "
                                            f"{f.name} in {f.module!r}: {f.reason}"))
        return Cell(OK, f"{c.checked} ops checked, {c.skipped} skipped")
    return cell


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchparity", *args], capture_output=True, text=True, timeout=600)


def _last_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (p.stderr + "\n" + p.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def grads(spec: ZooSpec, wd: Path) -> Cell:
    """GradMonitor over 3 steps, twice; ``torchparity grads`` finds no drift (exit 0)."""
    from torchparity import GradMonitor

    for tag in ("a", "b"):
        tr = _trainer(spec, "fp32")
        with GradMonitor(tr.model, str(wd / tag), optimizer=tr.opt):
            tr.train(3)
    p = _cli("grads", str(wd / "a"), str(wd / "b"), "-o", str(wd / "out"))
    if p.returncode != 0:
        return Cell(CRASH if p.returncode not in (1, 2) else FALSE_ALARM, _short(f"exit {p.returncode}: {_last_line(p)}"))
    return Cell(OK, "no drift")


def graph(spec: ZooSpec, wd: Path) -> Cell:
    """``torchparity graph`` of two mix-level dumps of identical runs builds (exit 0, graph.html)."""
    for tag in ("a", "b"):
        _dump(spec, "fp32", wd / tag, level="mix")
    p = _cli("graph", str(wd / "a"), str(wd / "b"), "-o", str(wd / "out"))
    if p.returncode != 0 or not (wd / "out" / "graph.html").is_file():
        return Cell(CRASH if p.returncode not in (1, 2) else FALSE_ALARM, _short(f"exit {p.returncode}: {_last_line(p)}"))
    return Cell(OK, f"graph.html {(wd / 'out' / 'graph.html').stat().st_size // 1024} KiB")


@contextlib.contextmanager
def _together(tr: Trainer, path: Path) -> Any:
    """The dump, the NaN/Inf tracker and online compare at once (one op stream, three consumers)."""
    import torchparity

    with torchparity.dump(str(path), model=tr.model, level="aten"), torchparity.NanInfTracker(tr.model), \
            torchparity.CompareWithReference(reference="cpu", model=tr.model):
        yield


def bitwise(precision: str = "fp32") -> Callable[[ZooSpec, Path], Cell]:
    """Losses (2 steps) and final weights bitwise identical with each tool on and off."""
    def cell(spec: ZooSpec, wd: Path) -> Cell:
        import torchparity

        def run(ctx: Callable[[Trainer], Any] | None) -> tuple[list[float], list[torch.Tensor]]:
            tr = _trainer(spec, precision)
            if ctx is None:
                losses = tr.train(2)
            else:
                with ctx(tr):
                    losses = tr.train(2)
            return losses, [p.detach().clone() for p in tr.model.parameters()]

        tools: dict[str, Callable[[Trainer], Any]] = {
            "dump aten": lambda tr: torchparity.dump(str(wd / "aten"), model=tr.model, level="aten"),
            "dump mix": lambda tr: torchparity.dump(str(wd / "mix"), model=tr.model, level="mix"),
            "NanInfTracker": lambda tr: torchparity.NanInfTracker(tr.model),
            "GradMonitor": lambda tr: torchparity.GradMonitor(tr.model, str(wd / "g"), optimizer=tr.opt),
            "CompareWithReference": lambda tr: torchparity.CompareWithReference(reference="cpu", model=tr.model),
            "dump aten device_stats": lambda tr: torchparity.dump(str(wd / "ds"), model=tr.model, level="aten",
                                                                  device_stats=True),
            "dump + NaN/Inf + online on one stream": lambda tr: _together(tr, wd / "together"),
        }
        ref_losses, ref_params = run(None)
        bad = []
        for name, ctx in tools.items():
            losses, params = run(ctx)
            same = all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(losses, ref_losses)) and all(
                torch.equal(p, q) for p, q in zip(params, ref_params))
            if not same:
                bad.append(f"{name}: losses {losses} vs {ref_losses}")
        if bad:
            return Cell(FALSE_ALARM, _short("numerics changed: " + "; ".join(bad)))
        return Cell(OK, f"{len(tools)} tools, losses {ref_losses}")
    return cell


# ---- the feature table -----------------------------------------------------------------------

FEATURES: dict[str, Callable[[ZooSpec, Path], Cell]] = {}
for _lv in LEVELS:
    FEATURES[f"dump-{_lv}"] = dump_identity(_lv)
FEATURES["dump-aten-md5"] = dump_identity("aten", "md5")
FEATURES["dump-mix-tensor"] = dump_identity("mix", "tensor")
FEATURES["dump-aten-bf16"] = dump_identity("aten", precision="bf16")
# the batched device-statistics path (run on the CPU) against host statistics: same numbers
FEATURES["dump-aten-devstats"] = dump_identity("aten", b_options={"device_stats": True})
FEATURES["dump-mix-md5-devstats-bf16"] = dump_identity("mix", "md5", precision="bf16", b_options={"device_stats": True})
for _p in ("bf16", "fp16"):
    for _lv in LEVELS:
        FEATURES[f"{_p}-vs-fp32-{_lv}"] = lowp_clean(_p, _lv)
for _lv in ("aten", "module"):  # the second step: weights that one AdamW step moved apart by design
    FEATURES[f"bf16-vs-fp32-{_lv}-2steps"] = lowp_clean("bf16", _lv, steps=2)
FEATURES["fp16-vs-fp32-aten-2steps"] = lowp_clean("fp16", "aten", steps=2)
for _where in _FAULT_SITES:
    for _f in (1.05, 2.0):
        FEATURES[f"fault-{_where}-x{_f:g}"] = planted_fault(_where, _f)
FEATURES["fault-fwd-mm-x2-mix"] = planted_fault("fwd-mm", 2.0, level="mix")
for _lv in ("api", "module"):  # the planted faults at the coarser levels: module and phase named
    for _where in ("fwd-mm", "bwd-mm"):
        FEATURES[f"fault-{_where}-x2-{_lv}"] = planted_fault(_where, 2.0, level=_lv)
for _lv in ("api", "module", "mix"):  # every planted fault at every level
    for _where in _FAULT_SITES:
        for _f in (1.05, 2.0):
            FEATURES.setdefault(f"fault-{_where}-x{_f:g}-{_lv}", planted_fault(_where, _f, level=_lv))
FEATURES["fault-fwd-mm-x1.05-fp16"] = planted_fault("fwd-mm", 1.05, precision="fp16")
FEATURES["fault-bwd-mm-x2-extra-op"] = planted_fault("bwd-mm", 2.0, extra_clone=True)
FEATURES["fp16-scaler-overflow-vs-fp32-aten"] = fp16_scaler_overflow("aten")
FEATURES["fp16-scaler-overflow-vs-fp32-module"] = fp16_scaler_overflow("module")
FEATURES["naninf-clean"] = naninf_clean("fp32")
FEATURES["naninf-clean-bf16"] = naninf_clean("bf16")
FEATURES["naninf-dispatch"] = naninf_dispatch
FEATURES["naninf-light-clean"] = naninf_light_clean("fp32")
FEATURES["naninf-light-clean-bf16"] = naninf_light_clean("bf16")
FEATURES["naninf-light-clean-fp16"] = naninf_light_clean("fp16")
FEATURES["naninf-light-dispatch"] = naninf_light_dispatch
FEATURES["naninf-fp16-scaler-overflow"] = naninf_scaler_overflow(light=False)
FEATURES["naninf-light-fp16-scaler-overflow"] = naninf_scaler_overflow(light=True)
FEATURES["naninf-hook-write"] = naninf_hook("write")
FEATURES["naninf-hook-mul"] = naninf_hook("mul")
FEATURES["online-bf16"] = online("bf16")
FEATURES["grads"] = grads
FEATURES["graph"] = graph
FEATURES["bitwise-fp32"] = bitwise("fp32")
FEATURES["bitwise-bf16"] = bitwise("bf16")


def run_cell(model: str, feature: str, workdir: Path) -> Cell:
    """Run one cell in this process; exceptions become ``crash`` (with the innermost frame)."""
    import time

    spec, fn = ZOO[model], FEATURES[feature]
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        cell = fn(spec, workdir)
    except NotApplicable as e:
        cell = Cell(NA, _short(e))
    except BaseException as e:  # noqa: BLE001 - every escape is a verdict
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        cell = Cell(CRASH, _short(f"{type(e).__name__}: {e} (at {where})"))
    cell.seconds = round(time.perf_counter() - t0, 1)
    return cell
