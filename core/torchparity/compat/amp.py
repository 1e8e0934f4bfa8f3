"""What this torch can do with automatic mixed precision on the CPU."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def cpu_float16_amp() -> bool:
    """Can this torch run float16 autocast with a GradScaler on the CPU? ``torch.amp.GradScaler``
    takes a device from torch 2.3 on (before, it was CUDA's only), and a build without float16
    CPU kernels fails under autocast. The tests of GradScaler behaviour skip without it."""
    if not hasattr(torch.amp, "GradScaler"):
        return False
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2))
        torch.amp.GradScaler("cpu")
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: object | None = None) -> None:
    """``loss.backward(); optimizer.step()``, through ``scaler`` when given (a
    ``torch.amp.GradScaler``: scale, step, update), as a float16-AMP training loop does."""
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()  # type: ignore[attr-defined]
    scaler.step(optimizer)  # type: ignore[attr-defined]
    scaler.update()  # type: ignore[attr-defined]
