"""The NaN/Inf screen on the device path reads nothing back per op.

On an accelerator every scalar read of a device value (``bool(t)``, ``.item()``, ``.tolist()``)
is a host sync. The CPU runs the same device path when host reads are turned off
(``_host_read = False``: screens stay tensors until the step-end fold, as on CUDA); a counting
mode BELOW the tracker sees the tracker's own ops and counts its scalar reads. Found on an H200:
``if f and type(f) is int`` read every device screen of every op input (1121 syncs per step).
"""

from __future__ import annotations

from typing import Any

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


def test_device_screens_sit_in_an_arena() -> None:
    """Each device screen is written into a slot of a float32 arena (one reduction with out=, no
    allocation per screen): the fold stacks views of one storage (~10x cheaper on a GPU host than
    0-d tensors allocated one by one); the culprit is still named."""
    torch.manual_seed(0)
    model = _Net()
    t = NanInfTracker(model)
    t._host_read = False
    with _ToolOps() as below, t:
        _nan_step(model, torch.randn(8, 16))
    assert below.ops.get("aten.linalg_vector_norm.out", 0) > 10
    assert below.ops.get("aten.linalg_vector_norm.default", 0) == 0  # no screen of its own allocation
    assert below.ops.get("aten.empty.memory_format", 0) == 1  # one arena
    assert t.findings and t.findings[0].op == "aten.log.default", t.findings


def test_device_screens_without_the_out_variant_fall_back(monkeypatch) -> None:
    """A backend whose reduction has no out= variant: plain 0-d screens (stacked at the fold),
    the same finding."""
    import torchparity.online.naninf_screens as screens

    tried = []

    def no_out(t: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        tried.append(1)
        raise NotImplementedError("linalg_vector_norm.out is not implemented for this backend")

    monkeypatch.setattr(screens, "_screen_into", no_out)
    torch.manual_seed(0)
    model = _Net()
    t = NanInfTracker(model)
    t._host_read = False
    with t:
        _nan_step(model, torch.randn(8, 16))
    assert len(tried) == 1  # tried once, then plain screens for that device
    assert t.findings and t.findings[0].op == "aten.log.default", t.findings
