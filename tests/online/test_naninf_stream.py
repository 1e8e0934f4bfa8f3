"""NanInfTracker on the op stream: one interception shared with the other consumers, a device-layer
consumer's NaN found at its op whatever the attach order, and one step end for every consumer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import torchparity
from torchparity.capture.op_stream import LAYER_DEVICE, OpConsumer, op_stream
from torchparity.capture.tool_state import tool_is_busy, tool_work
from torchparity.online.naninf import NanInfTracker, NonFiniteError

NAN = float("nan")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()  # relu: an op the CPU path trusts not to create NaN (no screen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) * 0.5 + x


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(_Block(), _Block(), nn.Linear(8, 1))


def _steps(model: nn.Module, n: int = 2) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(n):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


class _Plant(OpConsumer):
    """A faulty device: the ``call``-th forward ``base`` op of each step returns NaN at index 3."""

    layer = LAYER_DEVICE

    def __init__(self, base: str, call: int) -> None:
        self.base, self.call = base, call

    def on_op(self, call: Any, args: tuple, kwargs: dict, run: Any) -> Any:
        out = run(*args, **kwargs)
        if call.info.base == self.base and call.phase == "forward" and call.index == self.call:
            with tool_work():
                out = out.clone()
                out.view(-1)[3] = NAN
        return out


class _Names(OpConsumer):
    """An observer (a stand-in for the dump's aten sink): the names of the ops it saw, per step."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ended: list[int] = []
        self.calls = self.detaches = 0

    def on_op(self, call: Any, args: tuple, kwargs: dict, run: Any) -> Any:
        self.calls += 1
        self.detaches += call.func is torch.ops.aten.detach.default
        if call.name is not None:
            self.names.append(call.name)
        return run(*args, **kwargs)

    def on_step_end(self, step: int) -> None:
        self.ended.append(step)


class _CountBelow(TorchDispatchMode):
    """Entered before the tools (so below them): counts the model's ops (not the tool's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.detaches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not tool_is_busy():
            self.n += 1
            self.detaches += func is torch.ops.aten.detach.default
        return func(*args, **(kwargs or {}))


def _torchparity_modes() -> list[Any]:
    return [m for m in _get_current_dispatch_mode_stack() if type(m).__module__.startswith("torchparity")]


def _found(t: NanInfTracker) -> list[tuple]:
    return [(f.kind, f.name, f.module, f.phase, f.step, f.value) for f in t.findings]


def test_tracker_is_a_consumer_of_the_op_stream() -> None:
    t = NanInfTracker(_model())
    with t:
        assert t in op_stream().consumers and t.running
        assert len(_torchparity_modes()) == 1
    assert t not in op_stream().consumers and not t.running
    assert _torchparity_modes() == []


@pytest.mark.parametrize("host", [True, False], ids=["host", "device-fold"])
@pytest.mark.parametrize("order", ["tracker-first", "device-first"])
def test_nan_planted_by_a_device_layer_consumer_is_found_at_its_op(order: str, host: bool) -> None:
    model = _model()
    plant = _Plant("relu", call=1)  # the second block's act
    t = NanInfTracker(model)
    t._host_read = host
    stream = op_stream()
    if order == "device-first":
        stream.attach(plant)
        t.start()
    else:
        t.start()
        stream.attach(plant)  # after the tracker: it must stop trusting relu at once
    try:
        losses = _steps(model, 1)
    finally:
        t.stop()
        stream.detach(plant)
    assert losses[0] != losses[0]
    assert _found(t)[:1] == [("created", "Aten.relu.1.forward", "1.act", "forward", 0, "NaN")]


def test_with_an_observer_one_interception_per_op_and_the_same_names() -> None:
    ref = _steps(_model())
    plant = _Plant("relu", call=0)
    with plant_attached(plant):
        alone = NanInfTracker(m := _model())
        with alone:
            _steps(m)
    model = _model()
    names = _Names()
    with _CountBelow() as below, plant_attached(plant):
        with op_stream().attached(names), NanInfTracker(model) as t:
            before = op_stream().intercepted
            assert len(_torchparity_modes()) == 1
            _steps(model)
            intercepted = op_stream().intercepted - before
    # each op once, for both consumers: as many interceptions as the observer alone causes, and
    # the model's ops as seen from below (detach aside: torch < 2.2 also shows the mode below the
    # `detach` calls some kernels make inside the stream's handler, sub-dispatches, not ops)
    model2 = _model()
    with plant_attached(plant), op_stream().attached(_Names()):
        before2 = op_stream().intercepted
        _steps(model2)
        alone_intercepted = op_stream().intercepted - before2
    assert intercepted == alone_intercepted
    assert names.calls - names.detaches == below.n - below.detaches
    assert _found(t) == _found(alone) and _found(t)[0][1] == "Aten.relu.0.forward"
    assert "Aten.relu.0.forward" in names.names  # the observer names the op as the finding does
    # tool off == tool on, without the plant
    model = _model()
    with op_stream().attached(_Names()), NanInfTracker(model):
        assert _steps(model) == ref


class plant_attached:  # noqa: N801 (a context manager, used like a function)
    def __init__(self, consumer: OpConsumer) -> None:
        self.c = consumer

    def __enter__(self) -> None:
        op_stream().attach(self.c)

    def __exit__(self, *exc: Any) -> None:
        op_stream().detach(self.c)


def test_with_dump_aten_findings_and_losses_unchanged(tmp_path) -> None:
    ref = _steps(_model())
    alone = NanInfTracker(m := _model())
    with alone:
        _steps(m)
    model = _model()
    names = _Names()
    with _CountBelow() as below:
        with torchparity.dump(str(tmp_path / "d"), model=model, level="aten", mode="statistics"):
            with NanInfTracker(model) as t, op_stream().attached(names):
                before = op_stream().intercepted
                modes = len(_torchparity_modes())
                dump_on_stream = len(op_stream().consumers) > 1
                losses = _steps(model)
                intercepted = op_stream().intercepted - before
    assert losses == ref  # bitwise: exact float equality
    assert _found(t) == _found(alone) == []
    if not dump_on_stream:
        pytest.skip("the dump's aten capture is not an op-stream consumer in this tree yet (stream-dump)")
    assert modes == 1
    assert intercepted == names.calls  # one interception per op for the three consumers
    assert names.calls - names.detaches == below.n - below.detaches  # (see the test above on detach)


def test_step_ends_the_stream_step_for_every_consumer() -> None:
    names = _Names()
    x = torch.ones(4)
    with op_stream().attached(names), NanInfTracker() as t:
        step0 = op_stream().step
        (x * 2).sum()
        t.step()
        assert op_stream().step == step0 + 1
        (x * 2).sum()
    assert names.ended == [step0]
    assert names.names.count("Aten.mul.0.forward") == 2  # names restart for everyone


def test_raise_comes_after_the_stream_ended_the_step() -> None:
    model = _model()
    names = _Names()
    with plant_attached(_Plant("relu", call=0)), op_stream().attached(names):
        with pytest.raises(NonFiniteError) as ei:
            with NanInfTracker(model, on_failure="raise"):
                _steps(model, 1)  # raises from optimizer.step(), after every consumer's on_step_end
        assert names.ended == [0] and op_stream().step == 1
    assert ei.value.finding.name == "Aten.relu.0.forward"
