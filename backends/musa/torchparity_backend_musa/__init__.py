"""torchparity backend for Moore Threads GPUs through ``torch_musa`` (device ``musa``).

``torch_musa`` is an out-of-tree PyTorch extension: importing it renames PyTorch's PrivateUse1
device to ``musa`` and installs ``torch.musa``. This backend never imports it at plugin discovery,
never renames PrivateUse1 itself, and refuses (with a reason) when another vendor already took
PrivateUse1 in this process, because a process can rename it only once.

Vendor calls relied on (the fake in ``tests/backends/fakes`` mimics exactly these):
``torch_musa.__version__``; ``torch.version.musa`` (optional); ``torch.musa.is_available``,
``device_count``, ``current_device``, ``get_device_name``, ``get_device_capability`` (optional),
``synchronize``, ``manual_seed_all``, ``get_rng_state``, ``set_rng_state``;
``torch.backends.mudnn.allow_tf32`` (optional: recorded and settable when present).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

from torchparity import hookimpl
from torchparity.errors import UsageError
from torchparity.plugin_types import Availability, DeviceBackend

if TYPE_CHECKING:  # pragma: no cover
    import torch

__version__ = "0.1.0"


def privateuse1_owner() -> Optional[str]:
    """The name PrivateUse1 carries in this process if torch is imported and it was renamed.

    ``None`` when torch is not imported yet (then nothing can have renamed it) or when it still
    has its default name ``privateuseone``. Never imports torch.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        name = torch._C._get_privateuse1_backend_name()
    except Exception:  # pragma: no cover - private API moved
        return None
    return None if name == "privateuseone" else name

def privateuse1_environment() -> dict[str, Any]:
    """For the dump header: what PrivateUse1 is called in this process and whether vendor
    extensions were allowed to autoload at ``import torch`` (``TORCH_DEVICE_BACKEND_AUTOLOAD``,
    torch >= 2.5; unset means on). Two dumps that differ here were not produced the same way."""
    return {
        "privateuse1_backend": privateuse1_owner() or "privateuseone",
        "torch_device_backend_autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1"),
    }


def probe_privateuse1_backend(backend: DeviceBackend) -> Availability:
    """Shared ``is_available`` for PrivateUse1 vendors: module installed, PrivateUse1 free or
    ours, extension imports, ``torch.<device>`` reports a device. Never raises."""
    mod_name = backend.vendor_module or ""
    try:
        if mod_name not in sys.modules and importlib.util.find_spec(mod_name) is None:
            return Availability(False, f"Python module '{mod_name}' is not installed (vendor SDK missing)")
        owner = privateuse1_owner()
        if owner is not None and owner != backend.device_type:
            return Availability(
                False,
                f"PrivateUse1 is already '{owner}' in this process and can be renamed only once; "
                f"run {backend.name} in its own process (dump per device, compare offline)",
            )
        import torch

        importlib.import_module(mod_name)
        mod = getattr(torch, backend.device_type, None)
        if mod is None or not hasattr(mod, "is_available"):
            return Availability(False, f"'{mod_name}' imported but torch.{backend.device_type} is missing")
        if not mod.is_available():
            return Availability(False, f"{mod_name} is installed but no {backend.device_type} device is visible (driver or device missing)")
    except Exception as exc:  # a broken SDK (missing .so, driver mismatch) must not break discovery
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return Availability(False, f"importing {mod_name} failed: {type(exc).__name__}: {msg}")
    return Availability(True)


class MusaBackend(DeviceBackend):
    """Moore Threads GPUs through ``torch_musa``."""

    name = "musa"
    device_type = "musa"
    vendor_module = "torch_musa"
    description = "Moore Threads GPUs via torch_musa (device musa)"

    @dataclass
    class Options:
        """Switches for a comparison run; ``None`` leaves the setting alone."""

        #: ``torch.backends.mudnn.allow_tf32`` (TF32 in muDNN fp32 matmul/conv), when torch_musa has it
        allow_tf32: Optional[bool] = None

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        if self.options.allow_tf32 not in (None, True, False):
            raise UsageError(f"backend '{self.name}': allow_tf32 must be true, false or null, got {self.options.allow_tf32!r}")

    def is_available(self) -> Availability:
        return probe_privateuse1_backend(self)

    def _mudnn(self) -> Any:
        import torch

        return getattr(torch.backends, "mudnn", None)

    def numerics_switches(self) -> dict[str, Any]:
        sw = super().numerics_switches()
        mudnn = self._mudnn()
        if mudnn is not None and hasattr(mudnn, "allow_tf32"):
            sw["mudnn_allow_tf32"] = bool(mudnn.allow_tf32)
        return sw

    def apply_numerics(self, options: Any = None) -> dict[str, Any]:
        """Apply the configured (or given) options; returns the previous values it changed."""
        opts = self.options if options is None else options
        want = dict(opts) if isinstance(opts, Mapping) else {"allow_tf32": opts.allow_tf32}
        prev: dict[str, Any] = {}
        if want.get("allow_tf32") is not None:
            mudnn = self._mudnn()
            if mudnn is None or not hasattr(mudnn, "allow_tf32"):
                raise UsageError("backend 'musa': this torch_musa has no torch.backends.mudnn.allow_tf32 switch; remove allow_tf32 from plugins.yaml")
            prev["allow_tf32"] = bool(mudnn.allow_tf32)
            mudnn.allow_tf32 = bool(want["allow_tf32"])
        return prev

    def environment(self) -> dict[str, Any]:
        import torch

        env = super().environment()
        tm = sys.modules.get("torch_musa")
        env.update(
            vendor="Moore Threads",
            torch_musa_version=getattr(tm, "__version__", None),
            musa_version=getattr(torch.version, "musa", None),
            musa_home=os.environ.get("MUSA_HOME") or os.environ.get("MUSA_PATH"),
            **privateuse1_environment(),
        )
        mod = getattr(torch, "musa", None)
        if mod is not None and mod.is_available():
            idx = mod.current_device()
            env["device_count"] = mod.device_count()
            env["device_name"] = mod.get_device_name(idx)
            cap = getattr(mod, "get_device_capability", None)
            if cap is not None:
                try:
                    major, minor = cap(idx)
                    env["compute_capability"] = f"{major}.{minor}"
                except Exception:
                    pass
        return env


@hookimpl
def torchparity_backends():
    yield MusaBackend()
