"""The NaN/Inf screen on the device path reads nothing back per op.

On an accelerator every scalar read of a device value (``bool(t)``, ``.item()``, ``.tolist()``)
is a host sync. The CPU runs the same device path when host reads are turned off
(``_host_read = False``: screens stay tensors until the step-end fold, as on CUDA); a counting
mode BELOW the tracker sees the tracker's own ops and counts its scalar reads. Found on an H200:
``if f and type(f) is int`` read every device screen of every op input (1121 syncs per step).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.capture.tool_state import tool_is_busy
from torchparity.online.naninf import NanInfTracker

_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class _ToolReads(TorchDispatchMode):
    """Counts scalar reads the tool issues (the model's own ``.item()`` is not the tool's)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in _READS and tool_is_busy():
            self.reads += 1
        return func(*args, **(kwargs or {}))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(self.fc1(self.norm(x)), dim=-1)
        return self.fc2(torch.nn.functional.gelu(h)) + x


def test_device_path_screens_are_not_read_per_op() -> None:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    t = NanInfTracker(model)
    t._host_read = False  # the accelerator path, on the CPU
    with _ToolReads() as below, t:
        for _ in range(3):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert t.findings == []
    # the state is read with one .tolist() per step end (no aten op): no scalar read per op
    assert below.reads == 0, f"{below.reads} scalar reads of device screens in 3 steps"


class _ToolOps(TorchDispatchMode):
    """Counts the ops the tool issues, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if tool_is_busy():
            self.ops[str(func)] = self.ops.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def _nan_step(model: nn.Module, x: torch.Tensor) -> None:
    h = model.fc1(model.norm(x))
    h = h * torch.log(h.new_tensor(-1.0))  # log(-1): NaN created here, read by fc2
    model.fc2(h).sum().backward()


def _device_nan_step(**tracker_kw: object) -> NanInfTracker:
    """``_nan_step`` under a NanInfTracker on its device path (on the CPU)."""
    torch.manual_seed(0)
    model = _Net()
    t = NanInfTracker(model, **tracker_kw)  # type: ignore[arg-type]
    t._host_read = False
    with t:
        _nan_step(model, torch.randn(8, 16))
    return t


def test_device_screens_are_batched() -> None:
    """Device screens are queued and reduced together: one multi-tensor reduction
    (``_foreach_norm``) per queue, written into a float32 arena (the fold stacks views of one
    storage, ~10x cheaper on a GPU host than 0-d tensors allocated one by one), no reduction
    launched per value; the culprit is still named."""
    with _ToolOps() as below:
        t = _device_nan_step()
    screens = below.ops.get("aten.select.int", 0)  # one arena slot per screen
    assert screens > 10
    assert below.ops.get("aten._foreach_norm.Scalar", 0) == 1  # fewer than 64 values: one queue
    # no reduction per value with out= (on the CPU, _foreach_norm's own loop shows as plain
    # linalg_vector_norm calls inside it; on CUDA it is one multi-tensor kernel)
    assert "aten.linalg_vector_norm.out" not in below.ops, below.ops
    assert below.ops.get("aten.stack.out", below.ops.get("aten.cat.out", 0)) == 1, below.ops
    assert below.ops.get("aten.empty.memory_format", 0) == 1  # one arena (one device, one dtype)
    assert t.findings and t.findings[0].op == "aten.log.default", t.findings


def test_queued_screens_run_before_an_in_place_write(monkeypatch) -> None:
    """A queued value overwritten in place (``h.zero_()``) is screened first, as the op that
    made it left it: the NaN ``log`` created is known (no sink ran: it is reported). Screened
    after the write, it would read zeros and the site would be lost."""
    import torchparity.online.naninf_screens as screens

    monkeypatch.setattr(screens, "_QUEUE_VALUES", 10**6)  # only the write can flush
    x = torch.rand(8, 16) + 0.5
    t = NanInfTracker()
    t._host_read = False
    with t:
        h = torch.log(-x)  # NaN everywhere
        h.zero_()
        (h + 1).sum()
    assert [f.op for f in t.findings + t.absorbed] == ["aten.log.default"], (t.absorbed, t.findings)


def test_queued_screens_run_before_an_op_outside_aten() -> None:
    """An op outside aten (a collective, a custom op) may write into its inputs without its
    schema saying so: queued screens run before it."""
    lib = torch.library.Library("tpnanq", "DEF")
    lib.define("scribble(Tensor x) -> Tensor")

    def scribble(x: torch.Tensor) -> torch.Tensor:
        x.zero_()  # in place, undeclared (runs below the dispatch mode: the tracker cannot see it)
        return x.clone()

    lib.impl("scribble", scribble, "CPU")
    x = torch.rand(8, 16) + 0.5
    t = NanInfTracker()
    t._host_read = False
    with t:
        h = torch.log(-x)
        torch.ops.tpnanq.scribble(h)
    assert [f.op for f in t.findings + t.absorbed] == ["aten.log.default"], (t.absorbed, t.findings)


def test_queue_size_does_not_change_findings(monkeypatch) -> None:
    """One value per queue, or the whole step in one: the same findings and absorbed sites."""
    import torchparity.online.naninf_screens as screens

    seen = []
    for size in (1, 7, 10**6):
        monkeypatch.setattr(screens, "_QUEUE_VALUES", size)
        t = _device_nan_step()
        seen.append(([(f.kind, f.name) for f in t.findings], [a.name for a in t.absorbed]))
    assert seen[0] == seen[1] == seen[2] and seen[0][0], seen


def test_device_screens_without_the_batched_reduction_fall_back(monkeypatch) -> None:
    """A backend without the multi-tensor reduction: the queued slots are filled one by one,
    later screens are plain 0-d screens (stacked at the fold); the same finding."""
    import torchparity.online.naninf_screens as screens

    tried = []

    def no_foreach(ts: list, out: torch.Tensor) -> None:
        tried.append(1)
        raise NotImplementedError("_foreach_norm is not implemented for this backend")

    monkeypatch.setattr(screens, "_screen_many", no_foreach)
    monkeypatch.setattr(screens, "_QUEUE_VALUES", 4)
    t = _device_nan_step()
    assert len(tried) == 1  # tried once, then plain screens for that device
    assert t.findings and t.findings[0].op == "aten.log.default", t.findings


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@_CUDA
def test_cuda_queued_screens_name_the_culprit_and_keep_the_numerics() -> None:
    """On CUDA (the batched path by default): the planted NaN is named, and a clean model's
    losses are bitwise those of the tool off."""
    def losses(track: bool) -> list[float]:
        torch.manual_seed(0)
        model = _Net().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(64, 16, device="cuda")
        out = []
        t = NanInfTracker(model)
        with t if track else contextlib.nullcontext():
            for _ in range(3):
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                out.append(loss.item())
        assert not track or t.findings == []
        return out

    assert losses(True) == losses(False)
    torch.manual_seed(0)
    model = _Net().cuda()
    t = NanInfTracker(model)
    with t:
        _nan_step(model, torch.randn(8, 16, device="cuda"))
    assert t.findings and t.findings[0].op == "aten.log.default", t.findings


@_CUDA
def test_cuda_screens_run_on_the_stream_their_values_were_made_on() -> None:
    """A value made on a side stream is screened on that stream (its queue is flushed there
    when the stream changes), so the screen never reads it before it is written."""
    side = torch.cuda.Stream()
    x = torch.rand(4096, 256, device="cuda") + 0.5
    t = NanInfTracker()
    with t:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            big = x @ x.t()  # long enough that a screen on another stream would race it
            h = torch.log(-big)  # NaN
        torch.cuda.current_stream().wait_stream(side)
        (x + 1).sum()
    assert [f.op for f in t.findings + t.absorbed][:1] == ["aten.log.default"], (t.findings, t.absorbed)


def test_stream_key_of_other_accelerators(monkeypatch) -> None:
    """On an accelerator other than CUDA the queue follows the device module's current stream
    (``stream_id``); a device module without streams gets no queue (one reduction per value)."""
    import torchparity.online.naninf_screens as screens

    class _Stream:
        def __init__(self, sid: int) -> None:
            self.stream_id, self.device_index = sid, 0

    class _Module:
        current = _Stream(7)

        def current_stream(self, device: torch.device) -> _Stream:
            return self.current

        def stream(self, s: _Stream) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

    # (xpu and xla stand for NPU/MUSA: device types this torch knows without a vendor stack)
    monkeypatch.setattr(screens, "_modules", {"xpu": _Module(), "xla": None})
    assert screens._stream_key(torch.device("xpu", 0)) == (0, 7)
    screens._modules["xpu"].current = _Stream(9)
    assert screens._stream_key(torch.device("xpu", 0)) == (0, 9)
    assert screens._stream_key(torch.device("xla", 0)) is None
    assert screens._stream_key(torch.device("cpu")) == 0
