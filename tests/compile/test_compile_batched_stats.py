"""The accelerator path of the compiled capture's statistics, run on the CPU (``device_stats=True``):
each value is queued on a StatBatcher (one copy kernel), the step's rows come from one flush (a
constant number of kernels, one transfer), no host read per value; and the rows agree with the
per-value host statistics."""

from __future__ import annotations

import collections
import json
import math

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.capture.stat_batch import StatBatcher
from torchparity.compile import compile_backend

from tests.compile.conftest import train_compiled

pytestmark = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                                reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)")

_NOT_KERNELS = ("aten.empty", "aten.view", "aten.slice", "aten.detach", "aten.alias", "aten._unsafe_view",
                "aten.as_strided", "aten.lift_fresh", "aten.unsqueeze", "aten.select")


class Deep(nn.Module):
    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def _train(backend, steps: int = 2, nan_at: int | None = None):
    torch.manual_seed(0)
    m = Deep()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))

    def loss_of(run, i: int) -> torch.Tensor:
        xi = x.clone()
        if nan_at == i:
            xi[0, 0] = float("nan")
        return run(xi).square().mean()

    return train_compiled(m, backend, steps, loss_of)


def _records(path, step: int = 0):
    return [json.loads(line) for line in (path / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()]


def test_batched_rows_agree_with_host_statistics_and_numerics_are_unchanged(tmp_path):
    base = _train("aot_eager")
    host = _train(compile_backend(tmp_path / "host", inner="eager"))
    batched = _train(compile_backend(tmp_path / "batched", inner="eager", device_stats=True))
    assert base[0] == host[0] == batched[0]
    assert all(torch.equal(a, b) for a, b in zip(base[1], batched[1]))
    for step in (0, 1):
        h, b = _records(tmp_path / "host", step), _records(tmp_path / "batched", step)
        assert [r["name"] for r in h] == [r["name"] for r in b] and len(h) > 30
        for rh, rb in zip(h, b):
            sh, sb = rh["tensors"][0]["stats"], rb["tensors"][0]["stats"]
            assert sh["max"] == sb["max"] and sh["min"] == sb["min"], rh["name"]
            assert sh["nan"] == sb["nan"] == 0 and sh["inf"] == sb["inf"] == 0
            for k in ("mean", "norm"):
                assert math.isclose(sh[k], sb[k], rel_tol=1e-5, abs_tol=1e-7), (rh["name"], k, sh[k], sb[k])


def test_batched_rows_count_nan_exactly(tmp_path):
    _train(compile_backend(tmp_path / "b", inner="eager", device_stats=True), steps=2, nan_at=1)
    first = _records(tmp_path / "b", 1)[0]  # the first layer's matmul: one NaN row of 8x16 -> 16 NaN
    st = first["tensors"][0]["stats"]
    assert st["nan"] == 16.0 and st["inf"] == 0 and math.isnan(float(st["max"]))  # JSON writes NaN as "NaN"


class _Count(TorchDispatchMode):
    """Counts the ops dispatched while it is on: entered inside the batcher's ``add`` (the one call
    the statistics op makes per value on this path) and ``flush``. (A mode around the whole step
    would keep Dynamo from compiling at all.)"""

    def __init__(self) -> None:
        super().__init__()
        self.values = 0
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not name.startswith(_NOT_KERNELS):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def test_at_most_two_kernels_per_value_and_no_host_read_per_value(tmp_path, monkeypatch):
    """Counted in the steps after the first (whose flush allocates the staging buffer and its
    zeros once: amortized to nothing over a run)."""
    counter = _Count()
    real_add, real_flush = StatBatcher.add, StatBatcher.flush
    steady = []

    def add(self, v):
        if not steady:
            return real_add(self, v)
        counter.values += 1
        with counter:
            return real_add(self, v)

    def flush(self):
        if not steady:
            out = real_flush(self)
            steady.append(True)
            return out
        with counter:
            return real_flush(self)

    monkeypatch.setattr(StatBatcher, "add", add)
    monkeypatch.setattr(StatBatcher, "flush", flush)
    cap = compile_backend(tmp_path / "c", inner="eager", device_stats=True)
    _train(cap, steps=4)
    kernels = sum(counter.ops.values())
    assert counter.values > 90  # 3 steps x (forward + backward values)
    assert kernels / counter.values <= 2.0, (kernels, counter.values, counter.ops)
    assert counter.ops["aten.copy_.default"] >= counter.values  # one staging copy per value (and the flush's)
    assert not any(k.startswith(("aten._local_scalar_dense", "aten.item")) for k in counter.ops)
    assert cap.transfers == 4  # one flush, one transfer, per step


def test_a_value_the_batcher_does_not_take_is_measured_by_the_op_itself():
    """An empty value at run time (a dynamic shape of 0): no staging row, so the op computes its
    own (NaN) row rather than handing back its uninitialised placeholder."""
    from torchparity.compile.stats_op import collecting, value_stats_op

    op = value_stats_op()
    refs = [None, None]
    with collecting(StatBatcher(), refs, cpu_too=True):
        staged = op(torch.ones(3), 0)
        empty = op(torch.ones(0), 1)
    assert refs[0] is not None and refs[1] is None
    assert empty.isnan().all() and staged.shape == (6,)


def test_the_many_values_op_measures_what_the_batcher_does_not_take():
    """The graph's one statistics op: staged values get the batcher's rows (in the graph's slot
    order, from ``first_slot``), an empty value its own NaN row; with every value staged it hands
    back a placeholder that carries no autograd history."""
    from torchparity.compile.stats_op import _PLACEHOLDERS, collecting, value_stats_many_op

    op = value_stats_many_op()
    refs = [None] * 4
    with collecting(StatBatcher(), refs, cpu_too=True):
        out = op([torch.ones(3), torch.ones(0), torch.full((5,), 2.0)], 1)
    assert refs[0] is None and refs[1] is not None and refs[2] is None and refs[3] is not None
    assert out.shape == (3, 6) and out[1].isnan().all()
    refs = [None, None]
    x = torch.randn(4, 4, requires_grad=True)
    with collecting(StatBatcher(), refs, cpu_too=True):
        op([x * 2, x + 1], 0)
    assert all(r is not None for r in refs)
    assert _PLACEHOLDERS and all(p.grad_fn is None and not p.requires_grad for p in _PLACEHOLDERS.values())


@pytest.fixture
def batcher_calls(monkeypatch):
    """The number of values of each ``StatBatcher.add_many`` call, in order."""
    calls: list[int] = []
    real = StatBatcher.add_many

    def add_many(self, vs):
        calls.append(len(vs))
        return real(self, vs)

    monkeypatch.setattr(StatBatcher, "add_many", add_many)
    return calls


def test_one_batcher_call_per_group_of_values(tmp_path, monkeypatch, batcher_calls):
    """A graph run's values reach the batcher in groups of up to GROUP_VALUES consecutive values
    (one call, and one kernel launch per dtype where the Triton kernel runs), not one call per value."""
    calls = batcher_calls
    monkeypatch.setattr("torchparity.compile.instrument.GROUP_VALUES", 8)  # several groups per graph
    cap = compile_backend(tmp_path / "c", inner="eager", device_stats=True)
    _train(cap, steps=3)
    recs = _records(tmp_path / "c", 2)
    assert len(recs) > 30 and sum(calls) == 3 * len(recs) and max(calls) == 8
    assert len(calls) <= 3 * (len(recs) // 8 + 2)  # whole groups, forward and backward graph


def test_dynamic_shapes_are_grouped_too(tmp_path, batcher_calls):
    """Values of symbolic size are grouped by the size they had when traced (a symbolic size
    counted as a full group made every such value a group of its own: one op call per value)."""
    calls = batcher_calls
    torch.manual_seed(0)
    m = Deep(3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    cap = compile_backend(tmp_path / "d", inner="eager", device_stats=True)
    torch._dynamo.reset()
    run = torch.compile(m, backend=cap, dynamic=True)
    cap.attach(opt)
    for i, n in enumerate([8, 5, 13]):
        x = torch.randn(n, 16, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        run(x).square().mean().backward()
        opt.step()
    cap.close()
    # one call per graph run (forward, backward) and step: 6, not one per value
    assert len(calls) == 6, calls
    assert [len(_records(tmp_path / "d", s)) for s in range(3)] == [sum(calls) // 3] * 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_default_path_is_batched_and_agrees_with_the_host_statistics(tmp_path):  # pragma: no cover
    """On a GPU, by default: the values go through the batcher (no per-value reductions), the
    numerics are those of the plain compiled run, and the rows agree with a CPU host-path run of
    the same values to float32 accumulation."""
    added = []
    real_add = StatBatcher.add_many

    def add(self, vs):
        added.extend(v.device.type for v in vs)
        return real_add(self, vs)

    def train(backend, device):
        torch.manual_seed(0)
        m = Deep().to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch._dynamo.reset()
        run = torch.compile(m, backend=backend)
        if hasattr(backend, "attach"):
            backend.attach(opt)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
        for _ in range(2):
            opt.zero_grad()
            run(x).square().mean().backward()
            opt.step()
        if hasattr(backend, "close"):
            backend.close()
        return [p.detach().cpu() for p in m.parameters()]

    plain = train("aot_eager", "cuda")
    StatBatcher.add_many = add
    try:
        got = train(compile_backend(tmp_path / "gpu", inner="eager"), "cuda")
    finally:
        StatBatcher.add_many = real_add
    assert all(torch.equal(a, b) for a, b in zip(plain, got))
    recs = _records(tmp_path / "gpu", 1)
    assert added and set(added) == {"cuda"} and len(added) >= 2 * len(recs)
    for r in recs:
        st = r["tensors"][0]["stats"]
        assert st["nan"] == 0 and st["inf"] == 0 and st["norm"] > 0 and st["max"] >= st["min"]


def test_bad_device_stats_is_one_line(tmp_path):
    from torchparity.errors import UsageError

    with pytest.raises(UsageError, match="device_stats must be None"):
        compile_backend(tmp_path / "x", device_stats="yes")
