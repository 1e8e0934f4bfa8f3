"""The precision a module computed in, for its module records' ``flags["compute_dtype"]``.

A module whose inner ops run in bf16 (bf16 parameters) or under fp16/bf16 autocast may still
return float32 (HF upcasts logits and the loss; autocast returns fp32 from some ops): its output
carries that lower precision's rounding. The flag is the lowest-precision floating dtype among
the module subtree's parameters and the autocast dtype when autocast is enabled at its call;
set only when it is below float32 (absent: nothing to say). Cheap: no tensor data is read, the
parameter part is cached per module.

API-level records (levels ``api`` and ``mix``) carry the same flag when autocast is enabled for the
device of the call's first tensor argument (:func:`call_flags`): ``torch.gru`` or ``F.linear`` under
fp16 autocast reads and may return float32 tensors while computing in float16. Their backward
records get their forward call's flag. Aten records need none: autocast's casts are separate
kernels there, and every kernel sees the dtype it computes in.
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


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def _first_device(args: tuple, kwargs: dict) -> str | None:
    """The device type of the first tensor among the arguments (inside a list too), or None."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device.type
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor):
                    return x.device.type
    return None


def call_flags(args: tuple, kwargs: dict) -> dict[str, str] | None:
    """``{"compute_dtype": "float16"}`` (a new dict) for an API call made while autocast is enabled
    below float32 for the device of its first tensor argument, else None (then the record is
    exactly what it was without this flag). One C call when no autocast is enabled; no tensor data
    is read. Calls without a tensor argument (factories) get no flag: autocast does not apply."""
    if _any_autocast is not None and not _any_autocast():
        return None
    dev = _first_device(args, kwargs)
    if dev is None:
        return None
    ac = autocast_dtype(dev)
    return {"compute_dtype": str(ac).replace("torch.", "")} if ac in _LOW else None
