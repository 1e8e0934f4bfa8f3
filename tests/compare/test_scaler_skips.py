"""A float16 run whose GradScaler starts too high overflows its scaled backward and skips the
optimizer step, by design: compared with its float32 run, that backward is not judged (no root
cause is named in it) and the compare says why; a fault in the forward is still named, and a
backward fault in a step the scaler did not skip too. Found by a new-user check (session 18): an
fp16-AMP run started at scale 2**24 had the scaler's overflow (``_to_copy`` in the backward)
named the root cause."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchparity
from torchparity.compat.amp import backward_and_step, cpu_float16_amp

emulated = pytest.importorskip("torchparity_backend_emulated")


def _fault(op: str, phase: str) -> Any:
    """x2 on the first ``op`` of ``act`` in ``phase`` (the emulated device at full precision)."""
    return emulated.emulate(dtype=None, faults=[emulated.Fault(op=op, module="act", phase=phase, kind="scale",
                                                                factor=2.0)])


pytestmark = pytest.mark.skipif(not cpu_float16_amp(), reason="needs float16 autocast and GradScaler on the CPU")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _run(path: Path, level: str, amp: bool, init_scale: float = 2.0 ** 24, fault: Any = None) -> float:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if amp else None
    x = torch.randn(8, 16)
    with fault if fault is not None else contextlib.nullcontext():
        with torchparity.dump(str(path), level=level, model=model, fsync=False):
            with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                loss = model(x).float().pow(2).mean() * 1e4
            backward_and_step(loss, opt, scaler)
            opt.zero_grad()
    return scaler.get_scale() if scaler is not None else 0.0


@pytest.mark.parametrize("level", ["aten", "module"])
def test_a_skipped_step_has_no_root_cause_in_its_backward(tmp_path: Path, level: str) -> None:
    scale = _run(tmp_path / "dev", level, amp=True)
    assert scale < 2.0 ** 24  # the scaler found the overflow and skipped the step
    _run(tmp_path / "bench", level, amp=False)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), workers=1)
    assert res.root_cause is None, res.root_cause
    said = " ".join(res.summary["warnings"])
    assert "GradScaler" in said and "not compared" in said, said
    # its backward rows are not compared (exit 2, incomplete), not errors: no divergence
    assert not res.complete and not res.diverged, res.summary
    back = res.rows[res.rows["phase"] == "backward"]
    assert len(back) and (back["verdict"] == "skip").all() and back["reason"].str.contains("GradScaler").all()


def test_a_forward_fault_in_a_skipped_step_is_still_named(tmp_path: Path) -> None:
    _run(tmp_path / "dev", "aten", amp=True, fault=_fault("aten.gelu*", "forward"))
    _run(tmp_path / "bench", "aten", amp=False)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), workers=1)
    assert res.root_cause is not None and res.root_cause.phase == "forward", res.root_cause
    assert res.root_cause.op.startswith("aten.gelu"), res.root_cause


def test_a_backward_fault_where_the_scaler_did_not_skip_is_named(tmp_path: Path) -> None:
    scale = _run(tmp_path / "dev", "aten", amp=True, init_scale=2.0 ** 4,
                 fault=_fault("aten.gelu_backward*", "backward"))
    assert scale == 2.0 ** 4  # no skip
    _run(tmp_path / "bench", "aten", amp=False)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), workers=1)
    assert res.root_cause is not None and res.root_cause.phase == "backward", res.root_cause
    assert "GradScaler found" not in " ".join(res.summary["warnings"])
