"""The precision a module computed in, for its module records' ``flags["compute_dtype"]``.

A module whose inner ops run in bf16 (bf16 parameters) or under fp16/bf16 autocast may still
return float32 (HF upcasts logits and the loss; autocast returns fp32 from some ops): its output
carries that lower precision's rounding. The flag is the lowest-precision floating dtype among
the module subtree's parameters and the autocast dtype when autocast is enabled at its call;
set only when it is below float32 (absent: nothing to say). Cheap: no tensor data is read, the
parameter part is cached per module.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

#: lowest precision first
_ORDER = (torch.float8_e5m2, torch.float8_e4m3fn, torch.bfloat16, torch.float16) if hasattr(torch, "float8_e5m2") \
    else (torch.bfloat16, torch.float16)
_LOW = frozenset(_ORDER)

_cache: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.dtype | None, str | None]]" = weakref.WeakKeyDictionary()


def _params_info(module: torch.nn.Module) -> tuple[torch.dtype | None, str | None]:
    """(lowest low-precision floating dtype of the subtree's parameters or None, a device type)."""
    hit = _cache.get(module)
    if hit is not None:
        return hit
    low: torch.dtype | None = None
    dev: str | None = None
    for p in module.parameters():
        if dev is None:
            dev = p.device.type
        if p.dtype in _LOW and (low is None or _ORDER.index(p.dtype) < _ORDER.index(low)):
            low = p.dtype
    _cache[module] = (low, dev)
    return low, dev


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype enabled now for ``device_type``, or None (torch >= 2.1)."""
    try:
        if torch.is_autocast_enabled(device_type):  # torch >= 2.4
            return torch.get_autocast_dtype(device_type)
        return None
    except (TypeError, AttributeError, RuntimeError):
        pass
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return None


def compute_dtype(module: torch.nn.Module, outputs: Any = ()) -> str | None:
    """``"bfloat16"``/``"float16"``... when the module computes below float32 now, else None.
    ``outputs``: the call's output tensors (their device when the module has no parameters)."""
    low, dev = _params_info(module)
    if dev is None:
        dev = next((t.device.type for t in outputs if isinstance(t, torch.Tensor)), "cpu")
    ac = autocast_dtype(dev)
    cands = [d for d in (low, ac) if d in _LOW]
    if not cands:
        return None
    return str(min(cands, key=_ORDER.index)).replace("torch.", "")
