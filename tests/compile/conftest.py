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


def sgd_in_dump(model: torch.nn.Module, run: Any, out: Any = None, steps: int = 3,
                **dump_kwargs: Any) -> list[torch.Tensor]:
    """``steps`` SGD steps of ``run`` (``model``, compiled or with compiled parts) on a fixed 4x8
    batch against 4x4 targets, inside ``torchparity.dump(out, model=run, level="aten",
    **dump_kwargs)`` unless ``out`` is None. Returns the losses and the parameters after, detached."""
    import torchparity

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    d = torchparity.dump(out, model=run, **{"level": "aten", **dump_kwargs}).start() if out is not None else None
    losses = []
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss = ((run(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    finally:
        if d is not None:
            d.stop()
    return losses + [p.detach().clone() for p in model.parameters()]


class Block(torch.nn.Module):
    """A residual block: ``x + gelu(layer_norm(fc(x)))``, width 8."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.ln, self.act = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.ln(self.fc(x)))


class BlockNet(torch.nn.Module):
    """Three :class:`Block` s in a ``ModuleList`` (``blocks``) and a linear ``head`` to 4 outputs:
    the shape of a model whose layers a large job compiles one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)
