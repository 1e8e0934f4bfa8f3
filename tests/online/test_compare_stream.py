"""Online compare as a consumer of the op stream: one interception shared with the dump, a
device-layer consumer judged as the device, an emulated consumer detected, steps shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import torchparity
from torchparity.capture.op_stream import LAYER_DEVICE, OpCall, OpConsumer, op_stream
from torchparity.online.compare import CompareWithReference

PERTURBED = "Aten.mm.1.forward"  # the second forward mm: layers.0.down


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16, bias=False)
        self.down = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Perturb(OpConsumer):
    """A stand-in device: computes one ``aten.mm`` of step 0 1% too large."""

    layer = LAYER_DEVICE

    def __init__(self) -> None:
        self.hits: list[tuple[str, str | None]] = []

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        out = run(*args, **kwargs)
        if call.name == PERTURBED and call.step == 0:
            self.hits.append(call.where())
            return out * 1.01
        return out


class EmulatedBf16(OpConsumer):
    """A stand-in emulated device: forward results rounded to bfloat16 (stored as float32)."""

    layer = LAYER_DEVICE
    torchparity_emulated = True
    emulated_dtype = torch.bfloat16

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        out = run(*args, **kwargs)
        if (call.phase == "forward" and not call.info.inplace and not call.info.view and isinstance(out, torch.Tensor)
                and out.dtype == torch.float32):
            return out.to(torch.bfloat16).to(torch.float32)
        return out


def _train(model: nn.Module, steps: int = 2, opt: torch.optim.Optimizer | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 8, generator=gen) for _ in range(steps)]
    opt = opt if opt is not None else torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in xs:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _net() -> Net:
    torch.manual_seed(1)
    return Net()


def _tp_modes() -> list[str]:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return [type(m).__qualname__ for m in _get_current_dispatch_mode_stack()
            if type(m).__module__.startswith("torchparity")]


def _run(tmp: Path | None, device: OpConsumer | None, compare: bool) -> dict[str, Any]:
    """Train the test net with the given tools; what happened."""
    model = _net()
    res: dict[str, Any] = {"modes": []}
    s = op_stream()
    n0 = s.intercepted
    with torchparity.dump(tmp, level="aten", mode="statistics", model=model) if tmp is not None else _nothing():
        if device is not None:
            s.attach(device, model=model)
        try:
            c = CompareWithReference(model=model) if compare else None
            with c if c is not None else _nothing():
                res["modes"] = _tp_modes()
                res["consumers"] = [type(x).__name__ for x in s.consumers]
                res["losses"] = _train(model)
        finally:
            if device is not None:
                s.detach(device)
    res["intercepted"] = s.intercepted - n0
    res["failures"] = [(f.name, f.module, f.step, f.phase) for f in c.failures] if compare else None
    res["checked"] = c.checked if compare else 0
    return res


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_compare_with_aten_dump_one_interception_same_failures_same_losses(tmp_path: Path) -> None:
    plain = _run(None, None, compare=False)
    both = _run(tmp_path / "d0", None, compare=True)
    assert _bitwise(both["losses"], plain["losses"])  # the tools never change the user's numbers
    assert both["failures"] == [] and both["checked"] > 50

    device_only = _run(None, Perturb(), compare=False)
    alone = _run(None, Perturb(), compare=True)
    with_dump = _run(tmp_path / "d1", Perturb(), compare=True)
    assert alone["failures"] == [(PERTURBED, "layers.0.down", 0, "forward")]
    assert with_dump["failures"] == alone["failures"]
    assert _bitwise(alone["losses"], device_only["losses"]) and _bitwise(with_dump["losses"], device_only["losses"])
    # the compare's reference ops run while the stream's mode is off the stack: never intercepted
    assert alone["intercepted"] == device_only["intercepted"] > 100
    assert with_dump["intercepted"] == alone["intercepted"]  # the dump alongside: no second interception
    assert alone["modes"] == ["_StreamMode"]
    if with_dump["modes"] != ["_StreamMode"] and "CompareWithReference" in with_dump["consumers"] and len(
            with_dump["consumers"]) == 2:
        pytest.xfail(f"the aten dump is not an op-stream consumer yet (modes {with_dump['modes']}; "
                     "it lands with the stream-dump work)")
    assert with_dump["modes"] == ["_StreamMode"]


@pytest.mark.parametrize("order", ["device_first", "compare_first"])
def test_device_layer_consumer_is_what_compare_judges_whichever_attached_first(order: str) -> None:
    model, dev, s = _net(), Perturb(), op_stream()
    c = CompareWithReference(model=model)
    if order == "device_first":
        s.attach(dev, model=model)
        c.start()
    else:
        c.start()
        s.attach(dev, model=model)
    try:
        assert [type(x).__name__ for x in s.consumers] == ["CompareWithReference", "Perturb"]
        _train(model)
    finally:
        c.stop()
        s.detach(dev)
    assert dev.hits == [("layers.0.down", "Linear")]
    assert [(f.name, f.op, f.module, f.module_class) for f in c.failures] == [
        (PERTURBED, "aten.mm.default", "layers.0.down", "Linear")]
    assert s.consumers == ()


@pytest.mark.parametrize("order", ["device_first", "compare_first"])
def test_emulated_consumer_on_the_stream_is_detected(order: str) -> None:
    model, dev, s = _net(), EmulatedBf16(), op_stream()
    x = torch.randn(4, 8)
    c = CompareWithReference(model=model, target_ops=["mm"])
    if order == "device_first":
        s.attach(dev, model=model)
    c.start()
    if order == "compare_first":
        s.attach(dev, model=model)
    try:
        with torch.no_grad():
            model(x)
    finally:
        c.stop()
        s.detach(dev)
    assert c.emulated_dtype == torch.bfloat16
    assert ("device emulated at bfloat16" in c.log_lines[0]) == (order == "device_first")
    # judged at bf16: rounding like a bf16 device is no failure (at float32 all 5 mm would fail)
    assert c.checked == 5 and c.failures == []


class _StepWatch(OpConsumer):
    """Remembers the stream's step ends."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_step_end(self, step: int) -> None:
        self.seen.append(step)


def test_step_ends_the_stream_step_for_every_consumer() -> None:
    w, s = _StepWatch(), op_stream()
    model, seen = _net(), w.seen
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with s.attached(w):
        with CompareWithReference(model=model) as c:
            _train(model, steps=1, opt=opt)  # optimizer.step(): the stream's step 0 ends
            c.step()  # by hand: step 1 ends for everybody
            _train(model, steps=1, opt=opt)
    assert seen == [0, 1, 2] and c.current_step == 3
    with pytest.raises(torchparity.errors.UsageError, match="not running"):
        c.step()


def test_torch_musa_facade_steps_only_on_its_step_and_ends_no_empty_stream_step() -> None:
    from torchparity.compat.torch_musa import CompareWithCPU

    w, s = _StepWatch(), op_stream()
    model, seen = _net(), w.seen
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with s.attached(w):
        with CompareWithCPU(target_op=["torch.ops.aten.mm"]) as c:
            for _ in range(3):  # optimizer.step() ends the stream's step; step() adds no empty one
                _train(model, steps=1, opt=opt)
                c.step()
            for _ in range(2):  # no optimizer: step() ends the stream's step
                with torch.no_grad():
                    model(torch.randn(4, 8))
                c.step()
    assert c.step_cnt == 5 and c.engine.current_step == 5
    assert seen == [0, 1, 2, 3, 4]
