"""Small models and loops for the watch tests (CPU, a few ms a step)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import nn


class Guard(nn.Module):
    """``sqrt(x + 100)``: finite for ordinary activations, NaN from finite inputs below -100."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x + 100.0)


def guarded(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(proj=nn.Linear(8, 8), guard=Guard(), head=nn.Linear(8, 1)))


def batches(n: int = 10, bad: int | None = None, spike: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` regression batches; batch ``bad`` drives ``guard`` below -100 (NaN), batch ``spike``
    has targets 1000x larger (a loss spike)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        if i == bad:
            x = x * 1e4
        if i == spike:
            y = y * 1e3
        out.append((x, y))
    return out


def stepper(model: nn.Module, opt: torch.optim.Optimizer, dropout: bool = False) -> Callable[[Any], torch.Tensor]:
    """One training step: forward, MSE, backward, optimizer step (with dropout: draws from the RNG)."""

    def step(batch: Any) -> torch.Tensor:
        x, y = batch
        if dropout:
            x = torch.nn.functional.dropout(x, 0.1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def state(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Everything the run carries on: parameters and optimizer state tensors."""
    out = [p.detach().clone() for p in model.parameters()]
    for st in opt.state.values():
        out.extend(v.clone() for v in st.values() if isinstance(v, torch.Tensor))
    return out


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x.view(-1).view(torch.uint8) if x.dtype.is_floating_point else x, y.view(-1).view(torch.uint8) if y.dtype.is_floating_point else y) for x, y in zip(a, b))
