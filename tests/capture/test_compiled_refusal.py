"""A torch.compile'd model is never silently run eagerly by a capture: the op-level tools and the
API level refuse it with one line; the module level captures it with its compiled numerics."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchparity
from torchparity.capture.compiled import COMPILED_MODULES_RUN, MODULE_LEVEL_OK, CompiledModelError
from torchparity.errors import UsageError

# torch 2.1: calling torch.compile at all re-wraps every optimizer class's step() for the whole
# process (Dynamo's TorchPatcher), and the optimizer step hooks every torchparity tool ends its
# steps with stop firing; such a test would break the tests after it (docs/compile.md, limits)
pytestmark = pytest.mark.skipif(not MODULE_LEVEL_OK, reason="torch.compile on torch 2.1 breaks optimizer "
                                "step hooks process-wide (it cannot share the test process)")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))


def _train(model: nn.Module, steps: int = 2) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(steps):
        loss = (model(x) ** 2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out + [p.detach().clone() for p in model.parameters()]


def _same(a: list, b: list) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("level", ["api", "mix"])  # level="aten" captures it: tests/compile/test_dump_compiled.py
def test_an_op_or_api_level_dump_refuses_a_compiled_model_before_writing(tmp_path, level):
    model = torch.compile(_model(), backend="aot_eager")
    with pytest.raises(UsageError, match=r"torch.compile'd model.*change its numerics.*_orig_mod"):
        torchparity.dump(tmp_path / "d", level=level, model=model).start()
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").glob("step*"))


@pytest.mark.skipif(COMPILED_MODULES_RUN, reason="torch >= 2.9: the tracker lets compiled modules run compiled "
                                                 "(tests/online/test_naninf_compiled.py)")
def test_the_naninf_tracker_refuses_a_compiled_model_where_it_would_run_eagerly():
    model = torch.compile(_model(), backend="aot_eager")
    with pytest.raises(CompiledModelError, match="the NaN/Inf tracker cannot watch a torch.compile'd model"):
        torchparity.NanInfTracker(model).start()
    assert not torchparity.op_stream().consumers


def test_online_compare_refuses_a_compiled_model():
    model = torch.compile(_model(), backend="aot_eager")
    with pytest.raises(CompiledModelError, match="online compare .* cannot watch a torch.compile'd model"):
        torchparity.CompareWithReference(model=model).start()
    assert not torchparity.op_stream().consumers


def test_a_compiled_module_called_while_online_compare_runs_is_refused_not_run_eagerly():
    inner = _model()
    compiled = torch.compile(inner, backend="aot_eager")
    checker = torchparity.CompareWithReference(model=inner).start()  # given the eager module, the compiled one is called
    try:
        with pytest.raises(CompiledModelError, match="op-level capture"):
            compiled(torch.randn(2, 16))
    finally:
        checker.stop()
    compiled(torch.randn(2, 16))  # the guard is gone with the checker


@pytest.mark.skipif(not MODULE_LEVEL_OK, reason="torch 2.1's Dynamo fails on the module hooks: refused there")
def test_a_module_level_dump_keeps_the_compiled_numerics(tmp_path):
    reference = _train(torch.compile(_model(), backend="aot_eager"))
    model = torch.compile(_model(), backend="aot_eager")
    with torchparity.dump(tmp_path / "d", level="module", model=model):
        got = _train(model)
    assert _same(got, reference)
    assert len(torchparity.load_dump(tmp_path / "d")) > 0
