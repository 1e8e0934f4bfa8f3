"""Helpers shared by the compile tests."""

from __future__ import annotations

from typing import Any, Callable

import torch


def train_compiled(model: torch.nn.Module, backend: Any, steps: int,
                   loss_of: Callable[[Any, int], torch.Tensor]) -> tuple[list[float], list[torch.Tensor]]:
    """``steps`` SGD steps of ``model`` compiled with ``backend`` (None: eager), a capture backend
    attached to the optimizer and closed after; ``loss_of(run, i)`` is step ``i``'s loss.
    Returns (losses, parameters after)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch._dynamo.reset()
    run = torch.compile(model, backend=backend) if backend is not None else model
    if hasattr(backend, "attach"):
        backend.attach(opt)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = loss_of(run, i)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if hasattr(backend, "close"):
        backend.close()
    return losses, [p.detach().clone() for p in model.parameters()]
