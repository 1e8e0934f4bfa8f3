"""Reductions over consecutive segments of a device tensor, and small host tensors to the device:
shared by the statistics batcher's staging path (capture/stat_batch.py) and its Triton path
(capture/stat_triton.py), neither of which may wait for the device."""

from __future__ import annotations

import torch


class Segments:
    """Segment reductions over consecutive segments of given lengths."""

    def __init__(self, lens: torch.Tensor, k: int, total: int, device: torch.device, fallback: bool) -> None:
        self.lens, self.k, self.total, self.device = lens, k, total, device
        self.fallback = fallback or not hasattr(torch, "segment_reduce")
        self._ids: torch.Tensor | None = None

    def reduce(self, x: torch.Tensor, how: str) -> torch.Tensor:
        if not self.fallback:
            try:
                return torch.segment_reduce(x, how, lengths=self.lens, axis=0, unsafe=True)
            except (RuntimeError, NotImplementedError):  # not implemented on this device
                self.fallback = True
        if self._ids is None:
            self._ids = torch.repeat_interleave(torch.arange(self.k, device=self.device), self.lens,
                                                output_size=self.total)
        if how == "sum":
            return torch.zeros((self.k, *x.shape[1:]), dtype=x.dtype, device=self.device).index_add_(0, self._ids, x)
        return torch.empty(self.k, dtype=x.dtype, device=self.device).scatter_reduce_(
            0, self._ids, x, "amax" if how == "max" else "amin", include_self=False)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor to ``device`` without a host sync (pinned + non_blocking on CUDA)."""
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
