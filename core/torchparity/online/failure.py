"""What online compare reports: a failing op (:class:`OnlineFailure`), its log block and markers.

Shared by :mod:`.compare` (which finds failures), :mod:`.replay` (which re-judges a saved one) and
the torch_musa façade (which re-formats them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..errors import TorchparityError
from .judge import dtype_name

MARK_ERROR = "[torchparity:error]"
MARK_NANINF = "[torchparity:naninf]"
MARK_SKIP = "[torchparity:skip]"
MARK_SUMMARY = "[torchparity:summary]"


@dataclass
class OnlineFailure:
    """One op whose device output failed against the reference."""

    name: str  # dump-style record name, e.g. Aten.mm.3.forward
    op: str  # aten.mm.default
    module: str
    module_class: str | None
    step: int
    rank: int
    phase: str
    output: int  # index of the worst output
    checker: str
    verdict: str
    reason: str
    metrics: dict[str, Any] = field(default_factory=dict)
    worst: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    case: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CompareFailure(TorchparityError):
    """Raised by ``on_failure="stop"`` at the first failing op; ``.failure`` says which."""

    exit_code = 1

    def __init__(self, failure: OnlineFailure) -> None:
        super().__init__(f"online compare failed at {failure.name} (module {failure.module or '<root>'}, "
                         f"step {failure.step}): {failure.reason}" + (f"; case saved in {failure.case}" if failure.case else ""))
        self.failure = failure


def describe(t: Any) -> str:
    """``bfloat16[4, 8] cpu`` for a tensor, a short repr otherwise."""
    if isinstance(t, torch.Tensor):
        return f"{dtype_name(t.dtype)}{list(t.shape)} {t.device}"
    return repr(t)[:60]


def format_failure(f: OnlineFailure, emulated: str | None = None) -> str:
    """The multi-line log block of one failure (also printed by ``torchparity replay``)."""
    where = f"step {f.step} rank {f.rank} {f.phase}"
    lines = [f"{MARK_ERROR} {f.name} ({f.op}) module={f.module or '<root>'} {where}: {f.reason} [{f.checker}]"]
    lines.append("    inputs:  " + "; ".join(f.inputs))
    lines.append("    outputs: " + "; ".join(f.outputs) + (f"  (emulated {emulated} device)" if emulated else ""))
    shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in f.metrics.items()}
    lines.append("    metrics: " + " ".join(f"{k}={v}" for k, v in shown.items()))
    if f.worst:
        lines.append("    worst:   " + " | ".join(
            f"{w['index']} device={w['device']:.6g} reference={w['reference']:.6g}" if isinstance(w["device"], float)
            and isinstance(w["reference"], float) else f"{w['index']} device={w['device']} reference={w['reference']}"
            for w in f.worst))
    for n in f.notes:
        lines.append(f"    note:    {n}")
    if f.case:
        lines.append(f"    case:    {f.case}  (re-run: torchparity replay {f.case})")
    return "\n".join(lines)
