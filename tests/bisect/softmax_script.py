"""Bisect fixture: a stack of blocks, each a linear layer and a softmax; one block feeds its softmax
large logits (``hot``), so in bf16 its rounding is what diverges. Entry functions: ``main`` (hot
block 5 of 8), ``clean`` (no hot block), ``steps`` (two training steps, per-step outputs), ``native`` (for ``target="native"``)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, offset: float) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # softmax is shift-invariant in exact arithmetic; in bf16, logits near 256 keep 1 bit after the point
        return x + torch.softmax(self.proj(x) + self.offset, dim=-1)


def build(n: int = 8, hot: int | None = 5, dim: int = 16) -> nn.Module:
    return nn.Sequential(*[Block(dim, 256.0 if i == hot else 0.0) for i in range(n)])


def main() -> torch.Tensor:
    model = build()
    return model(torch.randn(4, 16))


def clean() -> torch.Tensor:
    return build(hot=None)(torch.randn(4, 16))


def steps() -> list[torch.Tensor]:
    """Two SGD steps; the outputs of each step."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs = []
    for _ in range(2):
        opt.zero_grad()
        out = model(torch.randn(4, 16))
        out.square().mean().backward()
        opt.step()
        outs.append(out.detach())
    return outs


def native(target: bool) -> torch.Tensor:
    """The same stack run natively in bf16 (``target=True``) or fp32: for ``--target native``."""
    model = build()
    x = torch.randn(4, 16)
    if target:
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    return model(x).float()


def faulty(target: bool) -> torch.Tensor:
    """The stack without a hot block, in float32; the target runs on the emulated device with a
    planted kernel fault (block 3's softmax scaled by 1.5): a wrong device kernel, not rounding.
    For ``--target native --promote-backend cpu``."""
    model = build(hot=None)
    x = torch.randn(4, 16)
    if not target:
        return model(x)
    from torchparity_backend_emulated import Fault, emulate

    with emulate(faults=[Fault(op="_softmax", module="3", kind="scale", factor=1.5, step=None)]):
        return model(x)
