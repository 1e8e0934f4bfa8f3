"""``torchparity.replay(case)``: re-run one saved failure case and judge it again.

Without a backend the saved device outputs are judged against a fresh reference run of the saved
inputs: the verdict the online compare gave, reproduced anywhere (no device needed), for a unit
test or a bug report. With ``backend="cuda"`` (or any installed backend, "emulated" included) the
op is re-run there and *that* output is judged, to check whether the device still gets it wrong.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..capture.tool_state import tool_work
from ..errors import UsageError
from .case import load_case, resolve_op
from .failure import OnlineFailure, describe, format_failure
from .judge import JudgeOptions, judge_outputs
from .reference import collect_outputs, run_reference


@dataclass
class ReplayResult:
    """What a replay found. ``verdict`` is ``pass``, ``warning`` or ``error``."""

    case: str
    name: str
    op: str
    verdict: str
    reason: str
    saved_verdict: str
    ran_on: str  # "saved outputs" or the backend the op was re-run on
    failure: OnlineFailure | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    emulated_dtype: str | None = None

    @property
    def reproduced(self) -> bool:
        """True when the replay gives the same verdict as the online compare did."""
        return self.verdict == self.saved_verdict

    def report(self) -> str:
        head = (f"replay {self.name} ({self.op}) on {self.ran_on}: {self.verdict}"
                + (" (reproduced)" if self.reproduced else f" (online compare said {self.saved_verdict})"))
        return head + ("\n" + format_failure(self.failure, self.emulated_dtype) if self.failure is not None else "")


def replay(case: str | Path, backend: str | None = None, reference: str | None = None,
           checkers: list[str] | None = None) -> ReplayResult:
    """Re-judge a failure case saved by ``CompareWithReference(save_failures=DIR)``.

    Args:
        case: the case directory (or its ``case.json``).
        backend: re-run the op on this backend (``cpu``, ``cuda``, ``emulated`` ...); ``None``:
            judge the saved device outputs.
        reference: reference backend (default: the one the case was compared against).
        checkers: online checkers to use (default: every enabled one).
    """
    from ..plugins import get_registry

    meta, args, kwargs, saved_outs, tensors = load_case(case)
    func = resolve_op(meta.get("op", ""))
    reg = get_registry()
    ref_name = reference or meta.get("reference") or "cpu"
    if ref_name not in reg.backends:
        raise UsageError(f"unknown reference backend {ref_name!r}; installed: {', '.join(sorted(reg.backends))}")
    ref_backend = reg.backends[ref_name]
    emulated = (meta.get("device") or {}).get("emulated_dtype")
    if "rng.cpu" in tensors:
        torch.set_rng_state(tensors["rng.cpu"])
    if backend is None:
        dev_outs: list[torch.Tensor | None] = list(saved_outs)
        ran_on = "saved device outputs"
    else:
        if backend not in reg.backends:
            raise UsageError(f"unknown backend {backend!r}; installed: {', '.join(sorted(reg.backends))}")
        b = reg.backends[backend]
        avail = b.is_available()
        if not avail:
            raise UsageError(f"backend {backend!r} is not available here: {avail.reason}")
        emulated = b.environment().get("emulated_dtype") if b.is_emulation else None
        dargs, dkwargs = b.to_device((args, kwargs))
        ctx = b.activate() if b.is_emulation else nullcontext()
        with ctx:
            res = func(*dargs, **dkwargs)
        dev_outs = collect_outputs(func, dargs, dkwargs, res)
        ran_on = f"backend {backend}" + (" (emulation)" if b.is_emulation else "")
    emu_dtype = getattr(torch, emulated) if emulated else None

    def same_dtype(d: torch.dtype) -> torch.dtype:
        return emu_dtype if emu_dtype is not None and d in (torch.float32, torch.float64) else d

    enabled = [c for c in reg.checkers.values() if "online" in getattr(c, "scopes", ())]
    if checkers is not None:
        enabled = [c for c in enabled if c.name in checkers]
    with tool_work():
        ref = run_reference(func, args, kwargs, same_dtype=same_dtype, high_dtype=ref_backend.reference_dtype,
                            device=ref_backend.device())
        if ref.error is not None or ref.same is None or ref.high is None:
            raise UsageError(f"cannot replay {meta.get('name')}: {ref.error or 'the reference produced nothing'}")
        v = judge_outputs(func, meta.get("name", ""), dev_outs, ref.same, ref.high, same_dtype=same_dtype,
                          checkers=enabled, options=JudgeOptions())
    name = str(meta.get("name", "?"))
    result = ReplayResult(case=str(case), name=name, op=str(func), verdict=v.result.verdict if v else "pass",
                          reason=v.result.reason if v else "", saved_verdict=str(meta.get("verdict", "error")),
                          ran_on=ran_on, metrics=dict(v.result.metrics) if v else {}, emulated_dtype=emulated)
    if v is not None and v.result.verdict in ("error", "warning"):
        flat_in = [t for t in _tensors((args, kwargs))]
        result.failure = OnlineFailure(
            name=name, op=str(func), module=str(meta.get("module", "")), module_class=meta.get("module_class"),
            step=int(meta.get("step", 0)), rank=int(meta.get("rank", 0)), phase=str(meta.get("phase", "")),
            output=v.output, checker=v.result.checker, verdict=v.result.verdict, reason=v.result.reason,
            metrics=dict(v.result.metrics), worst=v.worst, inputs=[f"{i}: {describe(t)}" for i, t in enumerate(flat_in)],
            outputs=[f"{i}: {describe(t)}" for i, t in enumerate(dev_outs) if t is not None], notes=list(ref.notes))
    return result


def _tensors(tree: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]
