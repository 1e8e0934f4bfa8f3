"""A step that holds only a GradScaler's ``update()`` after the last optimizer step.

A step ends at ``optimizer.step()``; ``scaler.step(opt)`` runs it, and ``scaler.update()`` comes
after, so the last step of an fp16 run with a GradScaler leaves one more step directory holding
the update alone (``Tensor.to``, ``_amp_update_scale_``). The fp32 reference has none. It is not
a step the two runs could be compared on, nor one compare failed to compare: it is told as what it
is, and counts neither as compared nor as missing.
"""

from __future__ import annotations

import json
from typing import Any

from .error_model import op_stem
from .loss_scale import SCALER_OPS, UPDATE_OP

#: ops of ``GradScaler.update()``: the scaler's bookkeeping ops (loss_scale) and the reads and
#: sums of its found-inf flags
TAIL_OPS = SCALER_OPS | {"fill_", "item", "_local_scalar_dense", "sum", "add", "add_"}
_MAX_RECORDS = 16


def is_scaler_tail(reader: Any, step: int, rank: int) -> bool:
    """The (step, rank) directory of ``reader`` holds only a GradScaler's update (a few records, at
    least one ``_amp_update_scale_``); False on any doubt (another format, unreadable, larger)."""
    try:
        u = reader.unit(step, rank)
        if u.format != "torchparity":
            return False
        path = u.path / "records.jsonl"
        if path.stat().st_size > 64 * 1024:
            return False
        ops = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                ops.append(op_stem(json.loads(line).get("op")))
            if len(ops) > _MAX_RECORDS:
                return False
    except (OSError, ValueError, AttributeError, TypeError):
        return False
    return UPDATE_OP in ops and all(o in TAIL_OPS for o in ops)


def tail_line(side: str, step: int, rank: int) -> str:
    return (f"step{step}/rank{rank} of the {side} dump holds only a GradScaler's update() after the last "
            f"optimizer step: nothing to compare")
