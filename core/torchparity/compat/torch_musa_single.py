"""torch_musa's single-op reproduction (``compare_for_single_op``, ``nan_inf_track_for_single_op``)
over torchparity's failure cases; re-exported by :mod:`torchparity.compat.torch_musa`.

The seed's ``DIR/torch.ops.aten.addmm_inputs.pkl`` path is resolved to the failure case that
``CompareWithCPU(dump_error_data=True)`` wrote for that op in ``DIR`` (JSON + safetensors: no pickle
is ever loaded).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..online.judge import DEFAULT_TOLERANCE, JudgeOptions
from ..online.naninf import NanInfTracker as _EngineNanInfTracker

__all__ = ["compare_for_single_op", "nan_inf_track_for_single_op"]


def _op_pattern(name: Any) -> str:
    """``'torch.ops.aten.addmm'`` / ``torch.ops.aten.addmm`` / ``'aten.addmm'`` -> engine pattern."""
    s = str(name)
    if s.startswith("torch.ops."):
        s = s[len("torch.ops."):]
    return s


def _resolve_case(inputs_path: str | os.PathLike[str], op: Any) -> Path:
    """A case directory, its case.json, or the seed's ``DIR/<op>_inputs.pkl`` (-> the case of that
    op in DIR, the newest if several)."""
    import json

    p = Path(inputs_path)
    if p.is_dir() or p.name == "case.json":
        return p
    if p.is_file():
        raise UsageError(f"{p}: torchparity does not load pickle files (they can run code); pass the failure "
                         "case directory that CompareWithCPU(dump_error_data=True) wrote")
    name = p.name
    for suffix in ("_inputs.pkl", "_outputs.pkl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    want = _op_pattern(name if name else op)
    cands = []
    if p.parent.is_dir():
        for c in p.parent.iterdir():
            meta = c / "case.json"
            if meta.is_file():
                try:
                    case_op = str(json.loads(meta.read_text(encoding="utf-8")).get("op", ""))
                except ValueError:
                    continue
                if case_op == want or case_op.rsplit(".", 1)[0] == want:
                    cands.append(c)
    if not cands:
        raise UsageError(f"{inputs_path}: no failure case of {want} in {p.parent}; CompareWithCPU("
                         "dump_error_data=True, output_dir=...) writes them")
    return max(cands, key=lambda c: (c / "case.json").stat().st_mtime_ns)


def _load(inputs_path: str | os.PathLike[str], op: Any) -> tuple[Path, dict, Any, tuple, dict, list]:
    from ..online.case import load_case, resolve_op

    case = _resolve_case(inputs_path, op)
    meta, args, kwargs, outs, _ = load_case(case)
    func = resolve_op(meta.get("op", ""))
    if op is not None and func is not op and getattr(func, "overloadpacket", None) is not op:
        raise UsageError(f"{case}: the case is op {meta.get('op')}, not {op}")
    return case, meta, func, args, kwargs, outs


def _single(outs: list) -> Any:
    return outs[0] if len(outs) == 1 else tuple(outs)


def compare_for_single_op(inputs_path: str | os.PathLike[str], op: Any = None, atol: float = 0.001,
                          rtol: float = 0.001, backend: str | None = None) -> tuple[bool, tuple, dict, Any]:
    """Re-judge one failing op saved by ``CompareWithCPU(dump_error_data=True)``.

    ``inputs_path`` is the case directory or the seed's ``DIR/torch.ops.aten.addmm_inputs.pkl``.
    Without ``backend`` the saved device outputs are judged against a fresh CPU run of the saved
    inputs (reproducible anywhere); ``backend="musa"``/``"emulated"``/... re-runs the op there.
    Returns ``(correct, args, kwargs, out)`` (``out``: the device output that was judged)."""
    from contextlib import nullcontext

    from ..capture.tool_state import tool_work
    from ..online.judge import judge_outputs
    from ..online.reference import collect_outputs, run_reference
    from ..plugins import get_registry

    case, meta, func, args, kwargs, outs = _load(inputs_path, op)
    reg = get_registry()
    emulated = (meta.get("device") or {}).get("emulated_dtype")
    if backend is not None:
        if backend not in reg.backends:
            raise UsageError(f"unknown backend {backend!r}; installed: {', '.join(sorted(reg.backends))}")
        b = reg.backends[backend]
        dargs, dkwargs = b.to_device((args, kwargs))
        with b.activate() if b.is_emulation else nullcontext():
            res = func(*dargs, **dkwargs)
        outs = collect_outputs(func, dargs, dkwargs, res)
        emulated = b.environment().get("emulated_dtype") if b.is_emulation else None
    emu = getattr(torch, emulated) if emulated else None

    def same_dtype(d: torch.dtype) -> torch.dtype:
        return emu if emu is not None and d in (torch.float32, torch.float64) else d

    cpu = reg.backends["cpu"] if "cpu" in reg.backends else None
    high = cpu.reference_dtype if cpu is not None else torch.float64
    with tool_work():
        ref = run_reference(func, args, kwargs, same_dtype=same_dtype, high_dtype=high, device=torch.device("cpu"))
        if ref.error is not None or ref.same is None or ref.high is None:
            raise UsageError(f"cannot re-run {meta.get('name')} on the CPU: {ref.error or 'no output'}")
        tol = {dt: (float(rtol), float(atol)) for dt in DEFAULT_TOLERANCE}
        v = judge_outputs(func, str(meta.get("name", "")), outs, ref.same, ref.high, same_dtype=same_dtype,
                          checkers=[], options=JudgeOptions(tolerance=tol))
    correct = v is None or v.result.verdict != "error"
    return correct, args, kwargs, _single(outs)


def nan_inf_track_for_single_op(inputs_path: str | os.PathLike[str], op: Any = None,
                                backend: str | None = None) -> tuple[bool, tuple, dict, Any]:
    """Re-run one saved op under the engine's NaN/Inf tracker; ``correct`` is False when the op
    produced (or read) a NaN/Inf. Runs on the CPU, or on ``backend`` (``"emulated"``, ...)."""
    from contextlib import nullcontext

    from ..plugins import get_registry

    case, meta, func, args, kwargs, _ = _load(inputs_path, op)
    ctx: Any = nullcontext()
    if backend is not None:
        reg = get_registry()
        if backend not in reg.backends:
            raise UsageError(f"unknown backend {backend!r}; installed: {', '.join(sorted(reg.backends))}")
        b = reg.backends[backend]
        args, kwargs = b.to_device((args, kwargs))
        ctx = b.activate() if b.is_emulation else nullcontext()
    tracker = _EngineNanInfTracker(on_failure="log")
    with ctx:
        with tracker:
            res = func(*args, **kwargs)
    from ..online.reference import collect_outputs

    outs = collect_outputs(func, args, kwargs, res)
    correct = not tracker.findings
    return correct, args, kwargs, _single(outs)
