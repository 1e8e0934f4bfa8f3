"""The batched device statistics (capture/stat_batch.py) give host_stats' values, in a constant
number of kernels per flush, from a copy taken at measure time; and a dump with device_stats on
records what it records with it off."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import torchparity
from torchparity.capture.options import DumpOptions
from torchparity.capture.stat_batch import StatBatcher
from torchparity.capture.stats import host_stats
from torchparity.errors import UsageError

from tests.capture.rows import assert_stats_close as _close

_SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e20, -3e37, 1e-30, 65504.0]
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.uint8, torch.bool]


@st.composite
def _values(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(st.sampled_from([(), (1,), (0,), (7,), (3, 5), (4, 1, 6), (40, 33)]))
    n = math.prod(shape)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1.0, 1e3, 1e20]))
    base = torch.randn(n, generator=g, dtype=torch.float64) * scale
    if n and dtype.is_floating_point:
        for _ in range(draw(st.integers(0, 3))):
            base[draw(st.integers(0, n - 1))] = draw(st.sampled_from(_SPECIALS))
    if dtype == torch.bool:
        t = base > 0
    elif not dtype.is_floating_point:
        t = (base.clamp(-1e6, 1e6) if dtype != torch.uint8 else base.abs().clamp(0, 255)).to(dtype)
    else:
        t = base.to(dtype)
    t = t.reshape(shape)
    view = draw(st.sampled_from(["plain", "transpose", "expand", "slice"]))
    if view == "transpose" and t.dim() >= 2:
        t = t.transpose(0, -1)
    elif view == "expand" and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(5, *t.shape[1:])
    elif view == "expand" and t.dim() == 0:
        t = t.expand(3, 4)  # zero strides
    elif view == "slice" and t.dim() >= 1 and t.shape[0] > 2:
        t = t[::2]
    return t


@pytest.mark.parametrize("fallback", [False, True], ids=["segment_reduce", "scatter"])
@settings(max_examples=40, deadline=None)
@given(values=st.lists(_values(), min_size=1, max_size=8))
def test_batched_rows_equal_host_stats(values: list[torch.Tensor], fallback: bool) -> None:
    b = StatBatcher(force_fallback=fallback)
    refs = [b.add(v) for v in values]
    b.flush()
    for v, r in zip(values, refs):
        want = host_stats(v)
        if want is None:
            assert r is None
            continue
        assert r is not None
        _close(r.values(), want)


def test_value_overwritten_after_measure_keeps_its_statistics() -> None:
    """The trap: an op right after the measurement writes the value in place (at api/module level
    the session does not see it); the row must describe the value as it was when measured."""
    b = StatBatcher()
    x = torch.arange(6, dtype=torch.float32)
    r = b.add(x)
    x.fill_(float("nan"))
    y = torch.ones(3)
    ry = b.add(y)
    b.flush()
    assert r is not None and ry is not None
    assert r.values() == [5.0, 0.0, 2.5, pytest.approx(math.sqrt(55)), 0.0, 0.0]
    assert ry.values()[:3] == [1.0, 1.0, 1.0]


def test_budget_flushes_and_large_values_are_measured_alone() -> None:
    b = StatBatcher(budget_bytes=4 * 100)  # 100 float32 elements
    small = [torch.full((30,), float(i)) for i in range(5)]  # 150 elements: one flush on the way
    big = torch.arange(500, dtype=torch.float32)  # over the budget: measured alone
    refs = [b.add(v) for v in small] + [b.add(big)]
    assert b.flushes == 1
    b.flush()
    assert [r.values()[0] for r in refs[:5]] == [0.0, 1.0, 2.0, 3.0, 4.0]  # type: ignore[union-attr]
    _close(refs[5].values(), host_stats(big))  # type: ignore[union-attr,arg-type]
    assert b.add(torch.empty(0)) is None and b.add(torch.ones(2, dtype=torch.complex64)) is None


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view:
            self.kernels += 1
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


def _flush_cost(values: list[torch.Tensor]) -> tuple[int, int, int]:
    """(kernels while adding, kernels of the flush, scalar reads) of measuring ``values``."""
    b = StatBatcher()
    for v in values:  # a first round allocates the buffers (grown by doubling: amortized)
        b.add(v)
    b.flush()
    with _Count() as c:
        for v in values:
            b.add(v)
        adding = c.kernels
        b.flush()
    return adding, c.kernels - adding, c.syncs


def test_one_kernel_per_value_and_a_constant_per_flush() -> None:
    kinds = [torch.randn(3, 4), torch.randn(8).half(), torch.arange(5), torch.randn(2, 3).t(),
             torch.randn(1).expand(7), torch.tensor(2.0, dtype=torch.float64)]
    few_add, few_flush, few_syncs = _flush_cost(kinds)
    many_add, many_flush, many_syncs = _flush_cost(kinds * 50)
    assert (few_add, many_add) == (len(kinds), 50 * len(kinds))  # one copy_ per value
    # per flush: a constant for each device/dtype group (float32 with the integers, float16, float64)
    assert few_flush == many_flush <= 3 * 60
    assert few_syncs == many_syncs == 0  # no .item() anywhere
    assert (many_add + many_flush) / (50 * len(kinds)) <= 2


def test_device_stats_option_is_validated() -> None:
    assert DumpOptions(device_stats=True).device_stats is True
    with pytest.raises(UsageError, match="device_stats"):
        DumpOptions(device_stats="yes")  # type: ignore[arg-type]


def _stats_by_name(root: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    for line in (root / "step0" / "rank0" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["name"]] = [(t["io"], t["arg"], t.get("stats")) for t in r["tensors"]]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: staged as bfloat16
@pytest.mark.parametrize("level", ["aten", "api"])
def test_dump_records_are_the_same_with_device_stats(tmp_path: Path, level: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)
    x = torch.randn(5, 8, dtype=dtype)
    x[0, 0] = float("nan")
    dumps = {}
    for on in (False, True):
        d = tmp_path / f"d{on}"
        with torchparity.dump(str(d), level=level, device_stats=on, model=model):
            y = model(x)
            y.sum().backward()
            x.add_(1.0)  # in place after the dump saw x: api level does not track this write
        dumps[on] = _stats_by_name(d)
        model.zero_grad()
        x.sub_(1.0)
    assert dumps[False].keys() == dumps[True].keys() and len(dumps[False]) > 3
    measured = 0
    for name, entries in dumps[False].items():
        for (io, arg, want), (io2, arg2, got) in zip(entries, dumps[True][name]):
            assert (io, arg) == (io2, arg2)
            assert (want is None) == (got is None), name
            if want is not None:
                measured += 1
                keys = ("max", "min", "mean", "norm", "nan", "inf")  # NaN/Inf are written as strings
                _close([float(got[k]) for k in keys], [float(want[k]) for k in keys])
    assert measured > 5


def _norm_of_both_paths(t: torch.Tensor) -> tuple[float, float]:
    """The norm from the host path and from the batched path."""
    from torchparity.capture.stats import host_stats

    got = host_stats(t)
    b = StatBatcher()
    ref = b.add(t)
    b.flush()
    assert got is not None and ref is not None
    return got[3], ref.values()[3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # float16 cannot hold such values
def test_norm_of_tiny_values_does_not_underflow(dtype: torch.dtype) -> None:
    """Adam's second moment after its first step holds values ~1e-26 whose float32 squares are 0:
    the host path gave a norm of 0 while the batched path gave the true one (a false root cause
    when a device dump is compared with a CPU reference)."""
    t = (torch.linspace(0.5, 1.0, 64) * 1e-26).to(dtype)
    assert t.abs().min() > 0
    want = torch.linalg.vector_norm(t.double()).item()
    host, batched = _norm_of_both_paths(t)
    assert host == pytest.approx(want, rel=1e-6, abs=0)
    assert batched == pytest.approx(want, rel=1e-6, abs=0)


def test_norm_of_huge_float64_values_does_not_overflow() -> None:
    """Squares of float64 values near 1e200 overflow float64: both paths scale first."""
    t = torch.linspace(0.5, 1.0, 64, dtype=torch.float64) * 1e200
    want = 1e200 * torch.linalg.vector_norm(t / 1e200).item()
    host, batched = _norm_of_both_paths(t)
    assert host == pytest.approx(want, rel=1e-12, abs=0)
    assert batched == pytest.approx(want, rel=1e-12, abs=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("special", [None, math.nan, math.inf, -math.inf])
def test_host_stats_of_large_tensors_take_exact_extremes(dtype: torch.dtype, special: float | None) -> None:
    """From _SPLIT_MINMAX elements on, host_stats takes amax and amin (two passes, faster there
    than aminmax): the extremes stay exact and NaN/Inf still show and are counted."""
    from torchparity.capture import stats as stats_mod

    n = stats_mod._SPLIT_MINMAX + 5
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, generator=g, dtype=dtype)
    if special is not None:
        x[n // 3] = special
        x[n - 1] = special
    got = host_stats(x)
    assert got is not None
    d = x.double()
    if special is None:
        assert got[0] == d.max().item() and got[1] == d.min().item()
        assert got[4:] == [0.0, 0.0]
        assert math.isclose(got[2], d.mean().item(), rel_tol=1e-5, abs_tol=1e-7)
        assert math.isclose(got[3], d.norm().item(), rel_tol=1e-6)
    elif math.isnan(special):
        assert math.isnan(got[0]) and math.isnan(got[1]) and got[4:] == [2.0, 0.0]
    else:
        assert (got[0] if special > 0 else got[1]) == special and got[4:] == [0.0, 2.0]
    # the same values as the aminmax path below the threshold
    small = host_stats(x[: stats_mod._SPLIT_MINMAX - 1].clone())
    ref = x[: stats_mod._SPLIT_MINMAX - 1].double()
    assert small is not None and (math.isnan(small[0]) or small[0] == ref.max().item())


_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_values_on_row_boundaries_and_long_values(device: str) -> None:
    """Values fill whole staging rows, the last one padded with zeros: a value of all-negative
    (or all-positive) numbers must not take the padding's 0 as its max (min); lengths just under,
    at and over a row, and a long value spanning thousands of rows, NaN/Inf in a last row."""
    from torchparity.capture.stat_batch import ROW

    g = torch.Generator().manual_seed(3)
    vals = []
    for n in (1, ROW - 1, ROW, ROW + 1, 3 * ROW + 7, 2_500_000):
        vals.append(-1.0 - torch.rand(n, generator=g))  # all negative: the padding must not be the max
        vals.append(5.0 + torch.rand(n, generator=g))  # all positive: nor the min
    odd = torch.randn(2 * ROW + 5, generator=g)
    odd[-1] = math.nan  # in the padded last row
    inf = torch.randn(ROW + 3, generator=g)
    inf[-2] = -math.inf
    vals += [odd, inf, torch.randn(ROW + 9, generator=g).to(torch.bfloat16), torch.randn(7, dtype=torch.float64)]
    b = StatBatcher()
    refs = [b.add(v.to(device)) for v in vals]
    b.flush()
    for v, r in zip(vals, refs):
        assert r is not None
        _close(r.values(), host_stats(v))  # type: ignore[arg-type]


def test_values_measured_alone_float64_huge_float8_and_wide_integers() -> None:
    """Found by an adversarial review: a float64 value measured alone (over the budget) had an
    infinite norm at 1e200, a float8 value measured alone raised, and 32/64-bit integers staged in
    float32 lost their last bits (16777217 read as 16777216)."""
    b = StatBatcher(budget_bytes=400)  # 50 float64 / 100 float32 elements: larger values go alone
    huge = torch.full((100,), 1e200, dtype=torch.float64)
    refs = [b.add(huge)]
    if hasattr(torch, "float8_e4m3fn"):
        f8 = torch.linspace(-3, 3, 1027).to(torch.float8_e4m3fn)
        refs.append(b.add(f8))
    wide = [torch.tensor([16777217]), torch.tensor([2**31 - 1], dtype=torch.int32),
            torch.full((40,), 16777217, dtype=torch.int64)]
    b2 = StatBatcher()
    wide_refs = [b2.add(w) for w in wide]
    b.flush()
    b2.flush()
    got = refs[0].values()  # type: ignore[union-attr]
    assert got[3] == pytest.approx(1e201, rel=1e-12) and math.isfinite(got[3])
    if len(refs) > 1:
        _close(refs[1].values(), host_stats(f8.float()))  # type: ignore[union-attr,arg-type]
    for w, r in zip(wide, wide_refs):
        assert r is not None
        assert r.values()[:2] == [float(w.max()), float(w.min())]  # exact


@pytest.mark.skipif(not hasattr(torch, "float8_e5m2"), reason="no float8 dtypes in this torch")
@pytest.mark.parametrize("n", [4, 64, 300_000])
def test_host_stats_of_float8_values(n: int) -> None:
    """A CPU float8 value of more than 32 elements raised (no promotion for float8 types)."""
    v = torch.linspace(-3, 3, n).to(torch.float8_e5m2)
    assert host_stats(v) == pytest.approx(host_stats(v.float()))  # type: ignore[arg-type]


def test_aminmax_fallback_where_the_dtype_has_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.2 has no CPU aminmax for float16 (RuntimeError; other builds raise
    NotImplementedError): the statistics take it in float32 instead, with the same values, on the
    host path, alone (stats_tensor) and in the batched flush."""
    real = torch.aminmax

    def no_half(t: torch.Tensor, *args: object, **kwargs: object) -> object:
        if t.dtype == torch.float16:
            raise NotImplementedError("aminmax: float16 not implemented")
        return real(t, *args, **kwargs)

    v = torch.tensor([1.5, -2.0, 65504.0, 0.25], dtype=torch.float16)
    want = host_stats(v.float())
    monkeypatch.setattr(torch, "aminmax", no_half)
    from torchparity.capture.stats import safe_aminmax, stats_tensor

    mn, mx = safe_aminmax(v)
    assert (mn.item(), mx.item()) == (-2.0, 65504.0)
    big = v.repeat(100)  # past host_stats' few-values shortcut
    _close(host_stats(big), host_stats(big.float()))
    st = stats_tensor(v)
    assert st is not None
    _close(st.tolist(), want)
    b = StatBatcher(triton=False)
    r = b.add(v)
    b.flush()
    assert r is not None
    _close(r.values(), want)
