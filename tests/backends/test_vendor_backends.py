"""Vendor backends against fake vendor stacks (see conftest.py), plus the no-SDK behaviour."""

from __future__ import annotations

import pytest
import torch

from torchparity.errors import PluginError, UsageError
from torchparity_backend_cuda import CudaBackend
from torchparity_backend_maca import MacaBackend
from torchparity_backend_musa import MusaBackend
from torchparity_backend_npu import NpuBackend


def _configured(cls, **opts):
    b = cls()
    b.configure(opts)
    return b


# ---------------------------------------------------------------------------------------- no SDK
@pytest.mark.parametrize("cls, words", [(NpuBackend, "torch_npu"), (MusaBackend, "torch_musa")])
def test_privateuse1_backends_unavailable_without_sdk(no_vendor, cls, words):
    a = cls().is_available()
    assert not a and words in a.reason and "\n" not in a.reason


def test_maca_unavailable_on_stock_torch(no_vendor):
    a = MacaBackend().is_available()
    assert not a and "torch.version.maca" in a.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is visible")
def test_cuda_unavailable_reason_on_cpu_torch(no_vendor):
    a = CudaBackend().is_available()
    assert not a and a.reason and "\n" not in a.reason


# ---------------------------------------------------------------------------------------- NPU
def test_npu_with_fake_stack(fake_npu):
    fake = fake_npu()
    b = _configured(NpuBackend)
    assert b.is_available(), b.is_available().reason
    env = b.environment()
    assert env["backend"] == "npu" and env["device_type"] == "npu" and env["vendor"] == "Huawei"
    assert env["torch_npu_version"] == "2.1.0.post10" and env["cann_version"] == "8.0.RC3"
    assert env["device_name"] == "Ascend910B2" and env["device_count"] == 2
    assert env["overflow_mode"] == "inf_nan" and env["torch_version"] == torch.__version__
    sw = env["numerics"]
    assert sw["allow_hf32_matmul"] is False and sw["allow_hf32_conv"] is True and sw["overflow_mode"] == "inf_nan"
    b.synchronize()
    assert fake.device_module._state["synced"] == 1


def test_npu_uses_only_documented_calls(fake_npu, surfaces):
    NPU_SURFACE = surfaces["npu"]
    fake = fake_npu()
    b = _configured(NpuBackend)
    b.is_available(), b.environment(), b.seed(1), b.set_rng_state(b.get_rng_state()), b.synchronize()
    assert fake.calls and set(fake.calls) <= NPU_SURFACE, set(fake.calls) - NPU_SURFACE


def test_npu_overflow_mode_detection(fake_npu, monkeypatch):
    fake_npu(inf_nan=False)
    assert NpuBackend().overflow_mode() == "saturation"
    assert NpuBackend().environment()["numerics"]["overflow_mode"] == "saturation"


def test_npu_overflow_mode_from_env_when_probe_missing(fake_npu, monkeypatch):
    fake_npu(inf_nan=None)  # an old torch_npu without is_support_inf_nan
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    assert NpuBackend().overflow_mode() == "saturation"
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "1")
    assert NpuBackend().overflow_mode() == "inf_nan"


def test_npu_seed_and_rng_roundtrip(fake_npu):
    fake = fake_npu()
    b = _configured(NpuBackend)
    b.seed(123)
    state = b.get_rng_state()
    assert set(state) == {"cpu", "npu:0", "npu:1"}
    first = torch.rand(3, generator=fake.device_module._gens[1])
    cpu_first = torch.rand(3)
    b.set_rng_state(state)
    assert torch.equal(torch.rand(3, generator=fake.device_module._gens[1]), first)
    assert torch.equal(torch.rand(3), cpu_first)


@pytest.mark.parametrize("soc, expect", [("Ascend910A", torch.float32), ("Ascend910ProB", torch.float32),
                                         ("Ascend310P3", torch.float32), ("Ascend910B2", torch.bfloat16),
                                         ("Ascend910_9391", torch.bfloat16)])
def test_npu_upcast_by_soc(fake_npu, soc, expect):
    fake_npu(soc=soc)
    b = _configured(NpuBackend)
    assert b.is_available()
    assert b.compute_dtype(torch.bfloat16) == expect
    assert b.supports_dtype(torch.bfloat16) == (expect == torch.bfloat16)


def test_npu_upcast_option_and_namespaces(fake_npu):
    fake_npu()
    b = _configured(NpuBackend, upcast={"float64": "float32"})
    assert b.compute_dtype(torch.float64) == torch.float32
    assert NpuBackend.op_namespaces == ("npu",)
    apis = b.custom_api_functions()
    assert {"torch_npu.npu_rms_norm", "torch_npu.npu_swiglu"} <= set(apis)
    y, _ = apis["torch_npu.npu_rms_norm"](torch.ones(2, 4), torch.ones(4))
    assert torch.allclose(y, torch.ones(2, 4), atol=1e-5)


def test_npu_apply_numerics_and_determinism(fake_npu, monkeypatch):
    fake = fake_npu()
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    b = _configured(NpuBackend, allow_hf32_matmul=True, allow_hf32_conv=False)
    prev = b.apply_numerics()
    assert prev == {"allow_hf32_matmul": False, "allow_hf32_conv": True}
    assert fake.device_module.matmul.allow_hf32 is True and fake.device_module.conv.allow_hf32 is False
    b.apply_numerics(prev)
    assert fake.device_module.matmul.allow_hf32 is False
    was = torch.are_deterministic_algorithms_enabled()
    try:
        b.set_deterministic(True)
        import os

        assert os.environ["HCCL_DETERMINISTIC"] == "true" and torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was)


def test_npu_bad_options():
    with pytest.raises(UsageError, match="allow_hf32_matmul"):
        _configured(NpuBackend, allow_hf32_matmul="yes")
    with pytest.raises(PluginError, match="unknown option"):
        _configured(NpuBackend, hf32=True)


# ---------------------------------------------------------------------------------------- MUSA
def test_musa_with_fake_stack(fake_musa, surfaces):
    MUSA_SURFACE = surfaces["musa"]
    fake = fake_musa()
    b = _configured(MusaBackend, allow_tf32=True)
    assert b.is_available(), b.is_available().reason
    env = b.environment()
    assert env["vendor"] == "Moore Threads" and env["torch_musa_version"] == "1.3.2" and env["musa_version"] == "3.1.0"
    assert env["device_name"] == "MTT S4000" and env["compute_capability"] == "2.2"
    assert env["numerics"]["mudnn_allow_tf32"] is False
    assert b.apply_numerics() == {"allow_tf32": False} and fake.mudnn.allow_tf32 is True
    b.seed(7)
    st = b.get_rng_state()
    assert set(st) == {"cpu", "musa:0"}
    x = torch.rand(2, generator=fake.device_module._gens[0])
    b.set_rng_state(st)
    assert torch.equal(torch.rand(2, generator=fake.device_module._gens[0]), x)
    b.synchronize()
    assert set(fake.calls) <= MUSA_SURFACE, set(fake.calls) - MUSA_SURFACE


# ---------------------------------------------------------------------------------------- CUDA / MACA
def test_nvidia_gpu_is_cuda_not_maca(no_vendor, fake_cuda):
    fake_cuda(metax=False)
    assert CudaBackend().is_available()
    a = MacaBackend().is_available()
    assert not a and "torch.version.maca" in a.reason
    env = _configured(CudaBackend).environment()
    assert env["vendor"] == "NVIDIA" and env["device_name"].startswith("NVIDIA") and env["compute_capability"] == "9.0"
    assert env["cuda_runtime_version"] == "12.4"


def test_metax_gpu_is_maca_not_cuda(no_vendor, fake_cuda):
    fake_cuda(metax=True)
    a = CudaBackend().is_available()
    assert not a and "'maca'" in a.reason and "torch.version.maca=3.8.1.0" in a.reason
    assert MacaBackend().is_available(), MacaBackend().is_available().reason
    env = _configured(MacaBackend).environment()
    assert env["backend"] == "maca" and env["device_type"] == "cuda" and env["vendor"] == "MetaX"
    assert env["maca_version"] == "3.8.1.0" and env["device_name"] == "MetaX C550"
    assert env["cuda_compat_version"] == "11.6" and "driver_version" not in env
    assert env["vendor_markers"]["device_name"] == "MetaX C550"


def test_metax_detected_by_device_name_alone(no_vendor, fake_cuda, monkeypatch):
    fake_cuda(metax=True)
    monkeypatch.delattr(torch.version, "maca")
    a = CudaBackend().is_available()
    assert not a and "MetaX" in a.reason


def test_maca_path_alone_is_not_metax(no_vendor, fake_cuda, monkeypatch):
    fake_cuda(metax=False)
    monkeypatch.setenv("MACA_PATH", "/opt/maca")
    assert CudaBackend().is_available()
    a = MacaBackend().is_available()
    assert not a and "MACA_PATH" in a.reason


def test_cuda_numerics_switches_apply_and_restore(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    b = _configured(CudaBackend, allow_tf32=True, allow_fp16_reduced_precision_reduction=False,
                    allow_bf16_reduced_precision_reduction=False, cudnn_deterministic=True, cudnn_benchmark=False,
                    cublas_workspace_config=":4096:8")
    before = b.numerics_switches()
    with b.numerics(**{k: getattr(b.options, k) for k in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                                          "allow_bf16_reduced_precision_reduction", "cudnn_deterministic",
                                                          "cudnn_benchmark", "cublas_workspace_config")}) as sw:
        assert sw["allow_tf32"] is True and sw["cudnn_allow_tf32"] is True
        assert sw["allow_fp16_reduced_precision_reduction"] is False
        assert sw["allow_bf16_reduced_precision_reduction"] is False
        assert sw["cudnn_deterministic"] is True and sw["cublas_workspace_config"] == ":4096:8"
    after = b.numerics_switches()
    assert after == before


def test_cuda_apply_numerics_from_options(monkeypatch):
    b = _configured(CudaBackend, allow_tf32=True, float32_matmul_precision="high")
    before = b.numerics_switches()
    prev = b.apply_numerics()
    try:
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.get_float32_matmul_precision() == "high"
        assert set(prev) - {"_fp32_precision"} == {"allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"}
    finally:
        b.apply_numerics(prev)
    # restored exactly, including torch >= 2.9's fp32_precision settings the legacy flags rewrite,
    # so torch.get_float32_matmul_precision() still answers (it raises after a legacy/new API mix)
    assert b.numerics_switches() == before
    torch.get_float32_matmul_precision()


def test_cuda_set_deterministic_sets_cublas_workspace(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    was = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        CudaBackend().set_deterministic(True)
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = was[1], was[2]


def test_cuda_rng_capture_all_devices(no_vendor, fake_cuda):
    fake = fake_cuda(metax=False)
    b = CudaBackend()
    b.seed(3)
    st = b.get_rng_state()
    assert set(st) == {"cpu", "cuda:0"}
    x = torch.rand(2, generator=fake.generator)
    b.set_rng_state(st)
    assert torch.equal(torch.rand(2, generator=fake.generator), x)


def test_cuda_bad_options():
    with pytest.raises(UsageError, match="float32_matmul_precision"):
        _configured(CudaBackend, float32_matmul_precision="fast")
    with pytest.raises(UsageError, match="allow_tf32"):
        _configured(CudaBackend, allow_tf32="on")
