"""Each vendor backend driven through ``torchparity.dump(..., backend=NAME)`` on its fake stack:
the dump header says which hardware produced it, and what the header says changes the analysis
(Ascend saturation mode -> float32 saturation counts as overflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchparity
from torchparity.capture.session import tool_is_busy
from torchparity.errors import UsageError
from torchparity.cli.overflow_cmd import analyse
from torchparity.plugins import get_registry
from torchparity.toymodels import TinyConfig, make_batches, make_model, train
from torchparity_checker_overflow import OverflowChecker

class SaturatingMul(TorchDispatchMode):
    """Multiplications clamp to the dtype's max instead of overflowing, like an NPU in
    saturation mode (entered outside the dump, so the dump records the clamped result)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mul.Tensor and not tool_is_busy():
            big = torch.finfo(out.dtype).max
            out = torch.nan_to_num(out, posinf=big, neginf=-big)
        return out


CFG = TinyConfig(dim=16, hidden=32, layers=1, heads=2, seq=8, batch=2, vocab=32)


def _dump(path: Path, backend: str) -> dict:
    model = make_model(cfg=CFG)
    with torchparity.dump(str(path), backend=backend, level="aten", fsync=False, model=model):
        losses = train(model, make_batches(1, cfg=CFG))
    assert all(l == l for l in losses)
    header = json.loads((path / "step0" / "rank0" / "header.json").read_text())
    assert torchparity.load_dump(path)["record_id"].nunique() > 50  # the run was captured
    return header["backend"]


@pytest.fixture
def fresh_registry():
    """Backends probe the fake stack when asked; a fresh registry makes sure nothing is cached."""
    get_registry(reload=True)
    yield
    get_registry(reload=True)


def test_dump_through_npu(fake_npu, fresh_registry, tmp_path):
    fake_npu(soc="Ascend910B3")
    env = _dump(tmp_path / "npu", "npu")
    assert env["backend"] == "npu" and env["vendor"] == "Huawei" and env["device_name"] == "Ascend910B3"
    assert env["torch_npu_version"] == "2.1.0.post10" and env["cann_version"] == "8.0.RC3"
    assert env["overflow_mode"] == "inf_nan" and env["torch_version"] == torch.__version__
    assert env["privateuse1_backend"] == "privateuseone" and "torch_device_backend_autoload" in env
    assert env["numerics"]["allow_hf32_matmul"] is False


def test_dump_through_musa(fake_musa, fresh_registry, tmp_path):
    fake_musa()
    env = _dump(tmp_path / "musa", "musa")
    assert env["vendor"] == "Moore Threads" and env["device_name"] == "MTT S4000"
    assert env["torch_musa_version"] == "1.3.2" and env["musa_version"] == "3.1.0"
    assert env["compute_capability"] == "2.2" and env["numerics"]["mudnn_allow_tf32"] is False


@pytest.mark.parametrize("metax", [False, True])
def test_dump_through_cuda_and_maca_says_which_hardware(no_vendor, fake_cuda, fresh_registry, tmp_path, metax):
    fake_cuda(metax=metax)
    name = "maca" if metax else "cuda"
    env = _dump(tmp_path / name, name)
    assert env["backend"] == name and env["device_type"] == "cuda"
    if metax:
        assert env["vendor"] == "MetaX" and env["maca_version"] == "3.8.1.0" and env["device_name"] == "MetaX C550"
        assert "driver_version" not in env and env["cuda_compat_version"] == "11.6"
    else:
        assert env["vendor"] == "NVIDIA" and env["cuda_runtime_version"] == "12.4"
        assert env["device_name"].startswith("NVIDIA") and env["compute_capability"] == "9.0"
    assert "allow_tf32" in env["numerics"]
    # the other backend refuses this GPU, so a dump can never be mislabelled
    other = "cuda" if metax else "maca"
    with pytest.raises(UsageError, match="not available"):
        torchparity.dump(str(tmp_path / "other"), backend=other).start()


def test_unavailable_backend_is_a_clear_usage_error(no_vendor, fresh_registry, tmp_path):
    with pytest.raises(UsageError, match="torch_npu"):
        torchparity.dump(str(tmp_path / "x"), backend="npu").start()


def test_npu_saturation_mode_in_header_changes_overflow_meaning(fake_npu, fresh_registry, tmp_path):
    """On an NPU in saturation mode fp32 overflow gives the dtype's max, not Inf: the header says
    so and the overflow analysis counts fp32 max as overflow for that dump only."""
    fake_npu(inf_nan=False)
    path = tmp_path / "sat"
    with SaturatingMul(), torchparity.dump(str(path), backend="npu", level="aten", fsync=False):
        y = torch.full((4,), 1e30) * 1e30
    assert float(y.max()) == torch.finfo(torch.float32).max
    env = json.loads((path / "step0" / "rank0" / "header.json").read_text())["backend"]
    assert env["overflow_mode"] == "saturation"
    report = analyse(path, checker=OverflowChecker())
    assert report["saturation_dtypes"] == ["float32"]
    assert [f["op"] for f in report["first_critical"]] == ["aten.mul.Tensor"]
    # the same values from a device in inf_nan mode are not an fp32 overflow
    for header in path.glob("step*/rank*/header.json"):
        h = json.loads(header.read_text())
        h["backend"]["overflow_mode"] = "inf_nan"
        header.write_text(json.dumps(h))
    assert analyse(path, checker=OverflowChecker())["counts"]["critical"] == 0


# ------------------------------------------------------------------------------------ dump -> compare
def _bench(path: Path) -> Path:
    model = make_model(cfg=CFG)
    with torchparity.dump(str(path), backend="cpu", level="aten", fsync=False, model=model):
        train(model, make_batches(1, cfg=CFG))
    return path


@pytest.mark.parametrize("vendor", ["npu", "musa", "cuda", "maca"])
def test_vendor_dump_compares_with_cpu_bench(vendor, no_vendor, fake_npu, fake_musa, fake_cuda, fresh_registry, tmp_path):
    {"npu": fake_npu, "musa": fake_musa}.get(vendor, lambda: fake_cuda(metax=vendor == "maca"))()
    _dump(tmp_path / "dev", vendor)
    res = torchparity.compare(tmp_path / "dev", _bench(tmp_path / "cpu"))
    assert res.root_cause is None, res.root_cause  # same computation on the (fake) device: no divergence
    assert len(res.rows) > 100


def test_planted_fault_on_fake_npu_is_the_root_cause_offline(fake_npu, fresh_registry, tmp_path):
    from torchparity_backend_emulated import Fault, emulate

    fake_npu()
    model = make_model(cfg=CFG)
    with emulate(dtype=None, faults=[Fault(op="silu", call=0, kind="scale", factor=3.0)]):
        with torchparity.dump(str(tmp_path / "dev"), backend="npu", level="aten", fsync=False, model=model):
            train(model, make_batches(1, cfg=CFG))
    bench = _bench(tmp_path / "cpu")
    # offline, with vendor autoload off, through the CLI
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    p = subprocess.run([sys.executable, "-m", "torchparity", "compare", str(tmp_path / "dev"), str(bench), "-o",
                        str(tmp_path / "out"), "--format", "json"], capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert report["root_cause"]["op"] == "aten.silu.default" and report["root_cause"]["module"] == "layers.0.mlp"
