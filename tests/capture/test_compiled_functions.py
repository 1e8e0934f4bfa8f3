"""A function compiled with ``torch.compile`` (not a module given to the tool) keeps running
compiled while a torchparity capture is on: the user's numerics stay bitwise what they are
without the tool.

Before, any op-level consumer (aten dump, NaN/Inf tracker, online compare) made Dynamo skip the
compiled frames (a dispatch mode on the stack) and the functions ran eagerly; the API level's
function mode and the module tracker's global hooks were traced into the graph and broke it into
pieces. Inductor's float32 kernels round differently from eager's, so the parameters after a few
steps differed in the last bits: these tests failed on that code for every tool below.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import torchparity
from torchparity.capture import compiled
from torchparity.capture.compiled import DISPATCH_MODE_CAN_OPT_OUT, MODULE_LEVEL_OK

# torch 2.1's torch.compile re-wraps every optimizer's step() for the whole process (see
# test_compiled_refusal.py); Dynamo skips frames under a dispatch mode from torch 2.5 to 2.8 with
# no way for a mode to opt out (docs/compile.md): there these functions run eagerly
_RUNS_COMPILED = pytest.mark.skipif(not (MODULE_LEVEL_OK and DISPATCH_MODE_CAN_OPT_OUT),
                                    reason="torch before 2.9: a dispatch mode cannot let compiled frames run compiled")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(24, 48)
        self.norm = nn.LayerNorm(48)
        self.fc2 = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(torch.softmax(logits, -1) * 3.0 + logits, y)


# compiled once per test process, at first use (never at import: on torch 2.1 a torch.compile call
# breaks every optimizer step hook of the process, and the tests after this module's): each
# tool's run below reuses them (Dynamo's cache), as a training script calls its compiled
# functions again and again
_COMPILED: dict[str, Any] = {}


def _compiled_functions() -> tuple[Any, Any]:
    if not _COMPILED:
        _COMPILED["forward"] = torch.compile(lambda model, x: model(x))
        _COMPILED["loss"] = torch.compile(_loss)
    return _COMPILED["forward"], _COMPILED["loss"]


@pytest.fixture(autouse=True, scope="module")
def _room_for_recompiles() -> Any:
    """Each run compiles its own optimizer's step (Dynamo guards on the optimizer object): past
    Dynamo's recompile limit (8) it would run eagerly, and a late test would see eager numerics.
    Not on torch 2.1 (its tests here skip; Dynamo is left unloaded there)."""
    if not MODULE_LEVEL_OK:
        yield
        return
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    old = getattr(cfg, name)
    setattr(cfg, name, 64)
    yield
    setattr(cfg, name, old)


def _train(tool: Callable[[nn.Module], Any] | None, steps: int = 3) -> list[torch.Tensor]:
    forward, compiled_loss = _compiled_functions()
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_step = torch.compile(opt.step)
    g = torch.Generator().manual_seed(1)
    ctx = tool(model) if tool is not None else None
    if ctx is not None:
        ctx.__enter__()
    try:
        losses = []
        for _ in range(steps):
            x, y = torch.randn(32, 24, generator=g), torch.randint(0, 10, (32,), generator=g)
            loss = compiled_loss(forward(model, x), y)
            loss.backward()
            opt_step()
            opt.zero_grad()
            losses.append(loss.detach())
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return losses + [p.detach().clone() for p in model.parameters()]


def _eager_reference() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x, y = torch.randn(32, 24, generator=g), torch.randint(0, 10, (32,), generator=g)
        loss = _loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


TOOLS = {
    "dump aten": lambda d: (lambda m: torchparity.dump(d / "aten", model=m, level="aten")),
    "dump api": lambda d: (lambda m: torchparity.dump(d / "api", model=m, level="api")),
    "dump mix": lambda d: (lambda m: torchparity.dump(d / "mix", model=m, level="mix")),
    "dump module": lambda d: (lambda m: torchparity.dump(d / "module", model=m, level="module")),
    "NaN/Inf tracker": lambda d: (lambda m: torchparity.NanInfTracker(m)),
    "online compare": lambda d: (lambda m: torchparity.CompareWithReference(model=m)),
    "GradMonitor": lambda d: (lambda m: torchparity.GradMonitor(m, d / "grads")),
}


@pytest.fixture(scope="module")
def compiled_reference() -> list[torch.Tensor]:
    ref = _train(None)
    assert _same(_train(None), ref), "the compiled run itself is not repeatable in this process"
    if _same(ref, _eager_reference()):  # pragma: no cover - the test would prove nothing
        pytest.skip("Inductor's kernels round like eager's on this machine: eager and compiled agree")
    return ref


@_RUNS_COMPILED
@pytest.mark.parametrize("name", list(TOOLS))
def test_compiled_functions_keep_their_numerics_under_each_tool(tmp_path, compiled_reference, name):
    got = _train(TOOLS[name](tmp_path))
    assert _same(got, compiled_reference), f"{name} changed the numerics of the compiled functions"


@_RUNS_COMPILED
def test_the_dump_around_compiled_functions_still_has_its_steps(tmp_path):
    """The optimizer step's hooks (which end a step) still run for a compiled optimizer.step()."""
    _train(TOOLS["dump aten"](tmp_path))
    steps = sorted(p.name for p in (tmp_path / "aten").glob("step*"))
    assert steps == ["step0", "step1", "step2"]


def test_torch_2_5_to_2_8_say_once_that_compiled_functions_run_eagerly(monkeypatch):
    """Where a dispatch mode cannot opt out (simulated here), the first step end of an op-level
    capture after Dynamo met compiled code says so, once; nothing is said where it can."""
    import sys
    import types
    import warnings

    codes = types.SimpleNamespace(input_codes=types.SimpleNamespace(seen=[object()]))
    monkeypatch.setitem(sys.modules, "torch._dynamo.convert_frame", codes)
    monkeypatch.setattr(compiled, "_warned_eager", False)
    monkeypatch.setattr(compiled, "DISPATCH_MODE_CAN_OPT_OUT", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled.warn_if_compiled_functions_run_eagerly("the tool")  # torch >= 2.9: silent
    monkeypatch.setattr(compiled, "DISPATCH_MODE_CAN_OPT_OUT", False)
    monkeypatch.setattr(compiled, "_SKIPS_UNDER_MODES", True)
    with pytest.warns(RuntimeWarning, match=r"torch.compile'd function called while the tool is on runs eagerly"):
        compiled.warn_if_compiled_functions_run_eagerly("the tool")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled.warn_if_compiled_functions_run_eagerly("the tool")  # once per process


@_RUNS_COMPILED
def test_what_the_tools_cannot_see_of_compiled_functions_is_said(tmp_path):
    """The dump's step headers say that compiled functions' fused kernels are not recorded; a NaN
    made inside a compiled loss that reaches the gradients is reported as entered, with a note
    naming compiled code as a possible source (no op is blamed that did not make it)."""
    import json

    _train(TOOLS["dump aten"](tmp_path))
    header = json.loads((tmp_path / "aten" / "step1" / "rank0" / "header.json").read_text())
    assert "only the kernels it calls through the dispatcher" in header["compiled_functions"]

    @torch.compile
    def nan_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out * torch.sqrt(y - 5.0)).mean()  # NaN weights inside Inductor's kernel

    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchparity.NanInfTracker(model) as tracker:
        loss = nan_loss(model(torch.randn(4, 24)), torch.randn(4, 10))
        loss.backward()
        opt.step()
    assert tracker.first is None  # no tracked op created it
    entered = [f for f in tracker.findings if f.kind == "entered"]
    assert entered and "compiled function's or module's fused kernels" in str(entered[0])


@pytest.mark.skipif(not MODULE_LEVEL_OK, reason="torch 2.1: torch._dynamo.disable would stop every optimizer step "
                    "hook of the process (capture/compiled.eager_hook)")
def test_the_tools_optimizer_step_hooks_are_called_not_traced_inside_a_compiled_step(tmp_path):
    """With Dynamo loaded (any process that compiled something), the step hooks the tools add are
    marked for Dynamo to call as they are: inside a compiled ``optimizer.step()`` they run (the
    tool's step ends) instead of being traced into the graph with "does not know how to trace"
    warnings. Without Dynamo loaded they are the plain hooks (importing it costs seconds)."""
    import torch._dynamo  # noqa: F401 - loaded, as after any torch.compile
    from torch.optim import optimizer as optim_mod

    before = set(optim_mod._global_optimizer_pre_hooks) | set(optim_mod._global_optimizer_post_hooks)
    model = _Net()
    with torchparity.dump(tmp_path / "d", model=model, level="aten"), torchparity.NanInfTracker(model), \
            torchparity.GradMonitor(model, tmp_path / "g"):
        added = [h for d in (optim_mod._global_optimizer_pre_hooks, optim_mod._global_optimizer_post_hooks)
                 for k, h in d.items() if k not in before]
    assert len(added) >= 4
    assert all(getattr(h, "_torchdynamo_disable", False) for h in added)
