"""Shared by the scheduled-dump tests whose steps begin inside backward."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def records(d: Path, step: int) -> list[dict]:
    """The records of ``d/step{step}/rank0`` (none when the step was not written)."""
    f = d / f"step{step}" / "rank0" / "records.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def optimizer_in_backward(model: torch.nn.Module) -> None:
    """PyTorch's documented "optimizer step in backward" pattern: one optimizer per parameter,
    stepped from a post-accumulate-grad hook (so the dump's step ends inside backward)."""
    opts = {p: torch.optim.SGD([p], lr=0.01) for p in model.parameters()}

    def hook(p: torch.Tensor) -> None:
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
