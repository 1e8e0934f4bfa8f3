"""A stack whose bf16 error comes from every block (each adds 256 and takes it away again: bf16
keeps no bit after the point there): no small set of modules removes it -- the bisect's
``diffuse`` case."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x + torch.tanh((x @ self.w + 256.0) - 256.0)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(32)])

    def forward(self, x: torch.Tensor) -> tuple:
        outs = []
        for b in self.blocks:
            x = b(x)
            outs.append(x)
        return tuple(outs)


def main() -> tuple:
    return Stack()(torch.randn(4, 8))
