"""NanInfTracker's screen never reports a value the tensor does not hold (issue 14): masks filled
with ``finfo.min`` are finite, whatever a sum of them would overflow to."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.online import naninf
from torchparity.online.naninf import NanInfTracker


@pytest.fixture(params=[True, False], ids=["host", "device-fold"])
def host(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_finfo_min_mask_is_finite(host: bool, dtype: torch.dtype) -> None:
    t = NanInfTracker()
    t._host_read = host
    with t:
        lo = torch.finfo(dtype).min
        causal = torch.ones(16, 16, dtype=torch.bool).tril()
        mask = torch.where(causal, torch.zeros((), dtype=dtype), lo)  # Llama eager's mask: no Inf
        full = torch.full((16, 16), lo, dtype=dtype)  # its sum overflows too
        scores = torch.randn(2, 16, 16, dtype=dtype) + mask + 0 * full
        # float32 softmax of a float16 score, as HF models do (torch 2.1 has no float16 softmax on the CPU)
        torch.softmax(scores, -1, dtype=torch.float32 if dtype == torch.float16 else None).sum()
        t.step()
    assert t.findings == []


def test_real_inf_and_nan_still_found_exactly(host: bool) -> None:
    t = NanInfTracker()
    t._host_read = host
    with t:
        x = torch.full((8,), torch.finfo(torch.float32).max)
        (x * 4).add(1)  # overflows: Inf (not NaN)
        t.step()
        y = torch.zeros(8)
        y.div(y)  # 0/0: NaN
        t.step()
    assert [(f.name, f.value, f.step) for f in t.findings] == \
        [("Aten.mul.0.forward", "Inf", 0), ("Aten.div.0.forward", "NaN", 1)]


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "_local_scalar_dense" not in str(func):  # reading the scalar is no kernel
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_device_screen_is_one_kernel_per_value() -> None:
    x = torch.randn(1000, dtype=torch.bfloat16)
    with _Count() as c:
        s = naninf._screen(x)
    assert len(c.ops) == 1, c.ops
    assert torch.isfinite(s)
    x[3] = float("nan")
    x[5] = float("inf")
    assert torch.isnan(naninf._screen(x))
    x[3] = 0
    assert torch.isinf(naninf._screen(x))


def test_host_fact_is_one_kernel_unless_the_sum_overflows() -> None:
    x = torch.randn(1000)
    with _Count() as c:
        assert naninf._host_fact(x) == naninf._FINITE
    assert len(c.ops) == 1, c.ops
    m = torch.full((1000,), torch.finfo(torch.float32).min)
    assert naninf._host_fact(m) == naninf._FINITE  # confirmed by looking at the values
    m[0] = float("inf")
    m[1] = float("-inf")  # sums to NaN, holds only Infs
    assert naninf._host_fact(m) == naninf._INF
