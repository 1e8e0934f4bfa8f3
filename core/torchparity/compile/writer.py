"""A small writer of torchparity dumps (docs/dump-format.md) for records captured in compiled
graphs: one ``step{S}/rank{R}`` directory per step, written at the step's end."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import torch

from ..records import STAT_KEYS
from .records import NodeRecord


def _num(x: float) -> Any:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - distributed not built in
        pass
    return 0, 1


def write_step(root: Path, step: int, captured: list[tuple[NodeRecord, list[float]]], header_extra: dict[str, Any]) -> int:
    """Write one step's records (``captured``: record and its host statistics, in execution
    order). Returns the number of records written."""
    rank, world = _rank()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "torchparity.json").exists():
        _write_json(root / "torchparity.json", {"format": "torchparity-dump", "version": 1,
                                                "tool_version": _tool_version(), "created": _now()})
    d = root / f"step{step}" / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)
    header = {"format": "torchparity-dump", "version": 1, "step": step, "rank": rank, "world_size": world,
              "level": "aten", "mode": "statistics", "checksum": None, "created": _now(), "pid": os.getpid(),
              "hostname": socket.gethostname(), "torch_version": torch.__version__, "compile": header_extra}
    _write_json(d / "header.json", header)
    names: dict[str, int] = {}
    calls: dict[tuple[str, str, str], int] = {}
    stacks: dict[str, int] = {}
    lines = []
    for rid, (rec, stats) in enumerate(captured):
        short = rec.op.split(".")[1] if rec.op.startswith(("aten.", "prims.")) else rec.op.split(".")[0]
        n = names.get(short, 0)
        names[short] = n + 1
        key = (rec.phase, rec.module, rec.op)
        ci = calls.get(key, 0)
        calls[key] = ci + 1
        stack = None
        if rec.source:
            stack = stacks.setdefault(rec.source, len(stacks))
        entry = {"io": "output", "arg": "0", "kind": "tensor", "dtype": rec.dtype, "shape": rec.shape,
                 "stride": rec.stride, "device": rec.device, "requires_grad": False,
                 "stats": {k: (int(v) if k in ("nan", "inf") and math.isfinite(v) else _num(float(v)))
                           for k, v in zip(STAT_KEYS, stats)}}
        lines.append(json.dumps({
            "id": rid, "name": f"Aten.{short}.{n}.{rec.phase}", "op": rec.op, "level": "aten", "phase": rec.phase,
            "module": rec.module, "module_class": rec.module_class, "call_index": ci, "step": step, "rank": rank,
            "fwd": None, "stack": stack, "tensors": [entry],
            "flags": {"compiled": True, "node": rec.node, "node_id": rec.node_id}}))
    with open(d / "records.jsonl", "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    with open(d / "stacks.jsonl", "w", encoding="utf-8") as f:
        f.write("".join(json.dumps({"id": i, "frames": [s]}) + "\n" for s, i in stacks.items()))
    _write_json(d / "footer.json", {"complete": True, "records": len(lines), "tensor_bytes": 0,
                                    "budget_exhausted": False, "dropped_tensors": 0})
    return len(lines)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _tool_version() -> str:
    from .. import __version__

    return __version__
