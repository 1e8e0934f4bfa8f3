"""The cheap tier that stays on: finite loss, loss spike, gradient-norm spike, non-finite gradients.

Per step it adds one fused norm over the gradients (on the device, in an optimizer pre-hook, no
host sync) and one small host read of ``[loss, grad norm]`` (asynchronous on a CUDA device: read
at the next step). A non-finite gradient norm is the per-step NaN/Inf flag: it is NaN/Inf exactly
when some gradient holds a NaN/Inf.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..capture.tool_state import tool_work


@dataclass
class Trigger:
    """Why the watchdog fired: ``kind`` is ``nonfinite_loss``, ``nonfinite_grad``, ``loss_spike``
    or ``grad_spike``; ``value`` the step's value, ``threshold`` what it was judged against."""

    kind: str
    step: int
    value: float
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("value", "threshold"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = str(d[k])  # JSON has no NaN/Inf
        return d


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor | None:
    """The global L2 norm of the gradients, as a 0-d float32 tensor on their device (no sync)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is not None and not g.is_sparse:
            groups.setdefault((g.device, g.dtype), []).append(g)
    if not groups:
        return None
    with tool_work(), torch.no_grad():
        norms = []
        for gs in groups.values():
            norms.extend(n.float().reshape(()) for n in torch._foreach_norm(gs))
        dev = norms[0].device
        return torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))


class CheapTier:
    """Judges each step's ``(loss, grad norm)`` against running windows of the finite ones."""

    def __init__(self, window: int, min_window: int, loss_spike: float | None, grad_spike: float | None,
                 scaler: bool = False) -> None:
        self.losses: deque[float] = deque(maxlen=window)
        self.norms: deque[float] = deque(maxlen=window)
        self.min_window = min_window
        self.loss_spike, self.grad_spike = loss_spike, grad_spike
        self.scaler = scaler  # with a GradScaler, inf gradients are its business (it skips the step)

    def judge(self, step: int, loss: float, norm: float | None) -> Trigger | None:
        """The trigger of one step, or None; finite values join the windows."""
        if not math.isfinite(loss):
            return Trigger("nonfinite_loss", step, loss)
        if norm is not None and not math.isfinite(norm) and not self.scaler:
            return Trigger("nonfinite_grad", step, norm)
        if self.loss_spike is not None and len(self.losses) >= self.min_window:
            ref = max(abs(x) for x in self.losses)
            if abs(loss) > self.loss_spike * ref:
                return Trigger("loss_spike", step, loss, self.loss_spike * ref)
        if norm is not None and math.isfinite(norm) and self.grad_spike is not None and len(self.norms) >= self.min_window:
            ref = max(self.norms)
            if norm > self.grad_spike * ref:
                return Trigger("grad_spike", step, norm, self.grad_spike * ref)
        self.losses.append(loss)
        if norm is not None and math.isfinite(norm):
            self.norms.append(norm)
        return None
