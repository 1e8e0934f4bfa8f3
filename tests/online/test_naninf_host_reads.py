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
