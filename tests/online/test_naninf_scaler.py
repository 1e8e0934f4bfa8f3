"""fp16 AMP with a GradScaler: an overflow of the scaled backward is the scaler's business (it
skips the optimizer step and lowers the scale), not a finding; an overflow of the forward is.
Found by a new-user check (session 18): a Llama under fp16 autocast whose scale overflowed the
backward was reported as "_to_copy backward produced Inf from finite inputs"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchparity.compat.amp import cpu_float16_amp
from torchparity.online.naninf import NanInfTracker
from torchparity.online.naninf_findings import SCALER_NOTE


pytestmark = pytest.mark.skipif(not cpu_float16_amp(), reason="needs float16 autocast and GradScaler on the CPU")


class _Net(nn.Module):
    def __init__(self, blow_up: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.blow_up = blow_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.fc1(x))
        if self.blow_up:
            h = h * 70000.0  # float16 overflows (max 65504): Inf made in the forward
        return self.fc2(h)


def _train(model: nn.Module, tracker: NanInfTracker, steps: int, init_scale: float, by_hand: bool = False) -> list[float]:
    """fp16-AMP steps under ``tracker``; ``by_hand``: each iteration ends a tracker step (skipped
    optimizer steps end none). Returns the scale after each iteration."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x = torch.randn(4, 8)
    scales = []
    with tracker:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if by_hand:
                tracker.step()
            scales.append(scaler.get_scale())
    return scales


def test_an_overflowing_scaled_backward_is_absorbed_by_the_scaler() -> None:
    torch.manual_seed(0)
    model = _Net()
    t = NanInfTracker(model)
    scales = _train(model, t, 3, init_scale=2.0 ** 24)
    assert scales[-1] < 2.0 ** 24  # the scaler did skip steps (the backward overflowed)
    assert t.findings == [], t.findings
    assert t.absorbed and all(a.note == SCALER_NOTE and a.phase == "backward" for a in t.absorbed), t.absorbed
    assert "absorbed by the loss scaler" in str(t.absorbed[0])


def test_a_forward_overflow_under_the_scaler_is_still_a_finding() -> None:
    torch.manual_seed(0)
    model = _Net(blow_up=True)
    t = NanInfTracker(model)
    _train(model, t, 2, init_scale=2.0 ** 8)
    assert t.findings and t.findings[0].phase == "forward" and t.findings[0].op == "aten.mul.Tensor", t.findings
    assert t.findings[0].module == "" and t.findings[0].value == "Inf"


def test_light_steps_of_an_overflowing_scaled_backward_report_nothing() -> None:
    """On light steps the gradients overflow but the scaler keeps the parameters finite: no sink
    held a NaN/Inf."""
    torch.manual_seed(0)
    model = _Net()
    t = NanInfTracker(model, steps=[0], light="module")
    scales = _train(model, t, 4, init_scale=2.0 ** 24, by_hand=True)
    assert scales[1] < 2.0 ** 23  # light steps skipped too
    assert t.findings == [], t.findings
