"""The dump header's description of the device a run computed on (its backend's environment, or
the emulated device and its faults). Its own module so that every writer of a dump header (the
eager dump, the compiled capture) describes the device alike without importing one another."""

from __future__ import annotations

from typing import Any

import torch

from ..capture.op_stream import op_stream


def _describe_backend(name: str | None) -> dict[str, Any]:
    """The dump header's description of the device that produced it."""
    try:
        from ..plugins import get_registry

        reg = get_registry()
        if name is None:
            name = "cpu"
            for cand, b in reg.backends.items():
                if cand != "cpu" and not getattr(b, "is_emulation", False) and b.is_available():
                    name = cand
                    break
        return reg.backend(name).environment()
    except Exception as exc:  # describing the device must never stop a dump
        return {"backend": name or "unknown", "torch_version": torch.__version__, "error": str(exc)}


def _active_emulation() -> Any | None:
    """The emulated device the dump runs with (``with emulate(...)`` entered before the dump: a
    device-layer consumer of the op stream), if any: the header must say the device was
    emulated, and at which dtype."""
    return op_stream().emulation()


def describe_device(name: str | None) -> dict[str, Any]:
    """The header's ``backend`` entry: the named backend's environment (``None``: the first
    available non-CPU backend, else the CPU), or the emulated device the run is inside."""
    emu = _active_emulation() if name is None else None
    if emu is None:
        return _describe_backend(name)
    env = _describe_backend("emulated")
    dtype = getattr(emu, "emulated_dtype", None)
    env["emulation"] = True
    env["emulated_dtype"] = str(dtype).replace("torch.", "") if dtype is not None else None
    env["device_name"] = f"emulated device on the CPU ({env['emulated_dtype'] or 'full precision'})"
    env["faults"] = [f.to_dict() if hasattr(f, "to_dict") else str(f) for f in getattr(emu, "faults", [])]
    return env
