"""GradScaler loss scaling: a fp16-autocast + GradScaler run compared with its fp32 reference
divides the scale out of the scaled backward tensors and never blames the scaling ``mul``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchparity
from torchparity.compat.amp import backward_and_step

pytestmark = pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch.amp.GradScaler needs torch >= 2.3")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _run(path, level: str, amp: bool, scale: float = 2.0 ** 8, steps: int = 1, mode: str = "statistics") -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if amp else None
    torch.manual_seed(1)
    x, y = torch.randn(4, 16), torch.randint(0, 8, (4,))
    with torchparity.dump(str(path), model=net, level=level, mode=mode):
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                loss = nn.functional.cross_entropy(net(x).float() if amp else net(x), y)
            backward_and_step(loss, opt, scaler if amp else None)
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("level", ["api", "aten", "mix", "module"])
def test_fp16_gradscaler_vs_fp32_is_clean(tmp_path, level):
    _run(tmp_path / "dev", level, amp=True)
    _run(tmp_path / "bench", level, amp=False)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), step=0)
    assert res.root_cause is None, res.root_cause.reason
    assert not res.diverged
    assert any("scales its loss by 256" in w for w in res.summary["warnings"])
    back = res.rows[(res.rows["phase"] == "backward") & (res.rows["match"] != "unmatched")
                    & (res.rows["kind"] == "tensor")]
    assert len(back) and float(back["error"].max()) < 0.05  # compared divided by S (it was 255 before)


def test_scaled_rows_checksums_are_not_compared(tmp_path):
    # md5 mode: a scaled tensor's checksum says nothing about the unscaled one
    _run(tmp_path / "dev", "api", amp=True, mode="md5")
    _run(tmp_path / "bench", "api", amp=False, mode="md5")
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), step=0)
    assert res.root_cause is None
    r = res.rows
    scaled = r[(r["phase"] == "backward") & (r["match"] != "unmatched") & (r["kind"] == "tensor")]
    assert len(scaled) and not scaled["md5_differs"].any() and not scaled["md5_comparable"].any()


def test_same_scaler_on_both_sides_is_unchanged(tmp_path):
    _run(tmp_path / "a", "aten", amp=True)
    _run(tmp_path / "b", "aten", amp=True)
    res = torchparity.compare(str(tmp_path / "a"), str(tmp_path / "b"), step=0)
    assert res.root_cause is None and not res.diverged
    assert not any("scales its loss" in w for w in res.summary["warnings"])


def test_different_scales_on_both_sides(tmp_path):
    _run(tmp_path / "a", "api", amp=True, scale=2.0 ** 8)
    _run(tmp_path / "b", "api", amp=True, scale=2.0 ** 4)
    res = torchparity.compare(str(tmp_path / "a"), str(tmp_path / "b"), step=0)
    assert res.root_cause is None and not res.diverged
    ws = " ".join(res.summary["warnings"])
    assert "device run scales its loss by 256" in ws and "bench run scales its loss by 16" in ws


def test_a_real_fault_in_a_scaled_backward_is_still_found(tmp_path):
    """A gradient x2 in the device's backward (a hook on the hidden activation) stays a divergence."""
    _run(tmp_path / "bench", "api", amp=False)
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    torch.manual_seed(1)
    x, y = torch.randn(4, 16), torch.randint(0, 8, (4,))
    def double_grad(_m, _i, out):
        out.register_hook(lambda g: g * 2)

    h = net[1].register_forward_hook(double_grad)
    with torchparity.dump(str(tmp_path / "dev"), model=net, level="api"):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(net(x).float(), y)
        backward_and_step(loss, opt, scaler)
    h.remove()
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), step=0)
    assert res.diverged and res.root_cause is not None
    rc = res.root_cause
    assert rc.phase == "backward", rc.reason  # the doubled gradient, never the forward loss-scale mul
    assert not any(s.phase == "forward" and s.op.endswith("mul") for s in res.suspects)


@pytest.mark.parametrize("level", ["api", "aten"])
def test_the_scalers_trailing_update_is_no_missing_step(tmp_path, level):
    """scaler.update() after the last optimizer step leaves a step directory of its own on the
    fp16 side only: told as what it is, neither "not compared" nor a reason for exit 2."""
    from torchparity.compare.shards import NOT_COMPARED, plan_shards

    _run(tmp_path / "dev", level, amp=True, steps=2)
    _run(tmp_path / "bench", level, amp=False, steps=2)
    assert (tmp_path / "dev" / "step2").is_dir() and not (tmp_path / "bench" / "step2").exists()
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert res.complete and not res.diverged and res.summary["steps"] == [0, 1]
    w = res.summary["warnings"]
    assert any("step2/rank0 of the device dump holds only a GradScaler's update()" in x for x in w), w
    assert not any("exists only in the device dump" in x for x in w), w
    plan = plan_shards(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert not plan.missing and any("GradScaler's update()" in m for m in plan.messages)


def test_a_real_one_sided_step_is_still_not_compared(tmp_path):
    """A guard: a step with model records on one side only is still reported as not compared."""
    _run(tmp_path / "dev", "api", amp=False, steps=2)
    _run(tmp_path / "bench", "api", amp=False, steps=1)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert any("step1/rank0 exists only in the device dump" in x for x in res.summary["warnings"])
