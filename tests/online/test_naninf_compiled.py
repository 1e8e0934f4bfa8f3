"""The NaN/Inf tracker on torch.compile'd modules (a compiled model, or its blocks compiled one by
one): from torch 2.9 they run compiled under the tracker, numerics unchanged, and a NaN made inside
one is told as entered, at its first tracked reader, with the compiled-code note (docs/naninf.md).
Online compare still refuses them (it cannot compare inside compiled code)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import torchparity
from tests.compile.conftest import BlockNet as Net
from torchparity.capture.compiled import COMPILED_MODULES_RUN, CompiledModelError

pytestmark = pytest.mark.skipif(not COMPILED_MODULES_RUN, reason="torch < 2.9: a dispatch mode cannot let compiled "
                                                                  "frames run compiled; the tracker refuses them")


def _net(how: str, backend: str = "inductor") -> tuple[Net, nn.Module]:
    """(the model, what the training loop calls): blocks compiled one by one, or the whole model."""
    torch.manual_seed(0)
    m = Net()
    if how == "blocks":
        for i, b in enumerate(m.blocks):
            m.blocks[i] = torch.compile(b, backend=backend)
        return m, m
    return m, torch.compile(m, backend=backend)


def _train(m: Net, run: nn.Module, tool: bool, n_steps: int = 2, **kw):
    torch._dynamo.reset()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    tracker = torchparity.NanInfTracker(run, **kw) if tool else None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if tracker is not None:
            tracker.__enter__()
        try:
            for _ in range(n_steps):
                run(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
        finally:
            if tracker is not None:
                tracker.__exit__(None, None, None)
    assert not [w for w in said if "global hooks" in str(w.message)]  # Dynamo's warning is not said: untrue here
    return [p.detach().clone() for p in m.parameters()], tracker


@pytest.mark.parametrize("how", ["blocks", "whole"])
@pytest.mark.parametrize("light", [False, True])
def test_compiled_modules_run_compiled_under_the_tracker_and_a_clean_run_is_clean(how, light):
    kw = {"steps": [0], "light": "module"} if light else {}
    plain, _ = _train(*_net(how), tool=False)
    got, tracker = _train(*_net(how), tool=True, **kw)
    assert all(torch.equal(a, b) for a, b in zip(plain, got))  # bitwise: compiled, not eager
    assert tracker.findings == []


def test_a_nan_made_inside_a_compiled_block_is_told_as_entered_there():
    m, run = _net("blocks")
    with torch.no_grad():
        m.blocks[1]._orig_mod.fc.weight[2, 3] = float("nan")
    _, tracker = _train(m, run, tool=True, n_steps=1)
    f = tracker.findings[0]
    # the block's matmul (an extern kernel the compiled graph calls through the dispatcher) read it
    assert f.step == 0 and f.module == "blocks.1" and f.phase == "forward"
    assert "compiled function's or module's fused kernels" in f.note


def test_online_compare_still_refuses_compiled_blocks():
    m, _ = _net("blocks", backend="aot_eager")
    with pytest.raises(CompiledModelError, match=r"blocks are torch.compile'd \('blocks.0'"):
        torchparity.CompareWithReference(model=m).__enter__()
