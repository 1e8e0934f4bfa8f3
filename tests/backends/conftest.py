"""Fake vendor stacks for testing the device backends without hardware.

Each fake mimics exactly the API surface its backend documents (module docstrings and
docs/backends.md) and logs every call in ``fake.calls`` so tests can check that the backend
uses nothing else. The fakes are installed with ``monkeypatch`` (``sys.modules`` entries and
``torch.<device>`` attributes) and disappear after each test. Nothing renames PrivateUse1 here:
that can happen once per process, so tests that need it run in a subprocess.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any, Callable

import pytest

NPU_SURFACE = {
    "torch_npu.utils.get_cann_version", "torch_npu.npu.utils.is_support_inf_nan",
    "torch.npu.is_available", "torch.npu.device_count", "torch.npu.current_device", "torch.npu.get_device_name",
    "torch.npu.synchronize", "torch.npu.manual_seed_all", "torch.npu.get_rng_state", "torch.npu.set_rng_state",
}
MUSA_SURFACE = {
    "torch.musa.is_available", "torch.musa.device_count", "torch.musa.current_device", "torch.musa.get_device_name",
    "torch.musa.get_device_capability", "torch.musa.synchronize", "torch.musa.manual_seed_all",
    "torch.musa.get_rng_state", "torch.musa.set_rng_state",
}


class CallLog(list):
    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*a: Any, **k: Any) -> Any:
            self.append(name)
            return fn(*a, **k)

        return inner


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


def make_device_module(device: str, calls: CallLog, *, count: int = 2, name: str = "FakeChip") -> types.ModuleType:
    """A ``torch.<device>`` module backed by CPU generators (one per fake device)."""
    import torch

    mod = _module(f"torch.{device}")
    gens = [torch.Generator().manual_seed(i) for i in range(count)]
    state = {"current": 0, "synced": 0}

    def get_rng_state(device_index: int | None = None) -> Any:
        return gens[state["current"] if device_index is None else int(device_index)].get_state()

    def set_rng_state(new_state: Any, device_index: int | None = None) -> None:
        gens[state["current"] if device_index is None else int(device_index)].set_state(new_state)

    def manual_seed_all(seed: int) -> None:
        for g in gens:
            g.manual_seed(seed)

    def sync() -> None:
        state["synced"] += 1

    p = f"torch.{device}."
    mod.is_available = calls.wrap(p + "is_available", lambda: count > 0)
    mod.device_count = calls.wrap(p + "device_count", lambda: count)
    mod.current_device = calls.wrap(p + "current_device", lambda: state["current"])
    mod.get_device_name = calls.wrap(p + "get_device_name", lambda i=None: name)
    mod.synchronize = calls.wrap(p + "synchronize", sync)
    mod.manual_seed_all = calls.wrap(p + "manual_seed_all", manual_seed_all)
    mod.get_rng_state = calls.wrap(p + "get_rng_state", get_rng_state)
    mod.set_rng_state = calls.wrap(p + "set_rng_state", set_rng_state)
    mod._gens, mod._state = gens, state
    return mod


class FakeNpu:
    """torch_npu + torch.npu. ``inf_nan`` selects what ``is_support_inf_nan()`` answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, inf_nan: bool | None = True, soc: str = "Ascend910B2",
                 count: int = 2) -> None:
        import torch

        self.calls = CallLog()
        tn = _module("torch_npu")
        tn.__version__ = "2.1.0.post10"
        tn.utils = _module("torch_npu.utils")
        tn.utils.get_cann_version = self.calls.wrap("torch_npu.utils.get_cann_version", lambda module="CANN": "8.0.RC3")
        tn.npu = _module("torch_npu.npu")
        tn.npu.utils = _module("torch_npu.npu.utils")
        if inf_nan is not None:
            tn.npu.utils.is_support_inf_nan = self.calls.wrap("torch_npu.npu.utils.is_support_inf_nan", lambda: inf_nan)

        def npu_rms_norm(x: Any, gamma: Any, epsilon: float = 1e-6) -> Any:
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
            return (x.float() * rstd * gamma.float()).to(x.dtype), rstd

        tn.npu_rms_norm = npu_rms_norm
        tn.npu_swiglu = lambda x, dim=-1: torch.nn.functional.silu(x.chunk(2, dim)[0]) * x.chunk(2, dim)[1]
        self.torch_npu = tn
        dev = make_device_module("npu", self.calls, count=count, name=soc)
        dev.matmul = types.SimpleNamespace(allow_hf32=False)
        dev.conv = types.SimpleNamespace(allow_hf32=True)
        self.device_module = dev
        monkeypatch.setitem(sys.modules, "torch_npu", tn)
        monkeypatch.setattr(torch, "npu", dev, raising=False)


class FakeMusa:
    """torch_musa + torch.musa + torch.version.musa + torch.backends.mudnn."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int = 1) -> None:
        import torch

        self.calls = CallLog()
        tm = _module("torch_musa")
        tm.__version__ = "1.3.2"
        self.torch_musa = tm
        dev = make_device_module("musa", self.calls, count=count, name="MTT S4000")
        dev.get_device_capability = self.calls.wrap("torch.musa.get_device_capability", lambda i=None: (2, 2))
        self.device_module = dev
        self.mudnn = types.SimpleNamespace(allow_tf32=False)
        monkeypatch.setitem(sys.modules, "torch_musa", tm)
        monkeypatch.setattr(torch, "musa", dev, raising=False)
        monkeypatch.setattr(torch.version, "musa", "3.1.0", raising=False)
        monkeypatch.setattr(torch.backends, "mudnn", self.mudnn, raising=False)


class FakeCudaDevice:
    """Makes CPU torch look like a CUDA build with one visible GPU (NVIDIA or MetaX).

    Patches ``torch.version.cuda``, ``torch.backends.cuda.is_built``, ``torch.cuda.is_available``,
    ``device_count``, ``current_device``, ``get_device_name``, ``get_device_properties``,
    ``get_rng_state_all``/``set_rng_state``/``manual_seed_all``; MetaX adds ``torch.version.maca``.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, metax: bool) -> None:
        import torch

        self.name = "MetaX C550" if metax else "NVIDIA H100 80GB HBM3"
        gen = torch.Generator().manual_seed(0)
        self.calls = CallLog()
        props = types.SimpleNamespace(name=self.name, major=9 if not metax else 8, minor=0, total_memory=80 * 2**30)
        monkeypatch.setattr(torch.version, "cuda", "11.6" if metax else "12.4")
        monkeypatch.setattr(torch.version, "hip", None)
        if metax:
            monkeypatch.setattr(torch.version, "maca", "3.8.1.0", raising=False)
        else:
            monkeypatch.delattr(torch.version, "maca", raising=False)
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        c = torch.cuda
        monkeypatch.setattr(c, "is_available", self.calls.wrap("torch.cuda.is_available", lambda: True))
        monkeypatch.setattr(c, "device_count", lambda: 1)
        monkeypatch.setattr(c, "current_device", lambda: 0)
        monkeypatch.setattr(c, "get_device_name", lambda i=None: self.name)
        monkeypatch.setattr(c, "get_device_properties", lambda i=None: props)
        monkeypatch.setattr(c, "get_rng_state_all", lambda: [gen.get_state()])
        monkeypatch.setattr(c, "set_rng_state", lambda s, device="cuda": gen.set_state(s))
        monkeypatch.setattr(c, "manual_seed_all", lambda s: gen.manual_seed(s))
        # torch < 2.2 optimizers ask the (absent) driver whether a CUDA graph is being captured
        monkeypatch.setattr(c, "is_current_stream_capturing", lambda: False)
        for var in ("MACA_PATH", "MACA_HOME"):
            monkeypatch.delenv(var, raising=False)
        self.generator = gen


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNpu]:
    return lambda **kw: FakeNpu(monkeypatch, **kw)


@pytest.fixture
def fake_musa(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeMusa]:
    return lambda **kw: FakeMusa(monkeypatch, **kw)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeCudaDevice]:
    return lambda **kw: FakeCudaDevice(monkeypatch, **kw)


@pytest.fixture
def no_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide any vendor module a developer machine might have, and their env vars."""
    import importlib.util

    real = importlib.util.find_spec
    hidden = {"torch_npu", "torch_musa", "torch_maca", "mcpytorch"}

    def find_spec(name: str, *a: Any, **k: Any) -> Any:
        return None if name in hidden else real(name, *a, **k)

    for m in hidden:
        monkeypatch.delitem(sys.modules, m, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for var in ("MACA_PATH", "MACA_HOME", "INF_NAN_MODE_ENABLE", "INF_NAN_MODE_FORCE_DISABLE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def surfaces() -> dict[str, set[str]]:
    """The vendor calls each backend documents that it relies on."""
    return {"npu": NPU_SURFACE, "musa": MUSA_SURFACE}
