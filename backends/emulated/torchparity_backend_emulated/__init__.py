"""torchparity's emulated device backend (an EMULATION on the CPU, not hardware).

It lets everything in torchparity be tested without a GPU/NPU: it behaves like a different device
by computing every floating op in bf16 or fp16 (and casting back), and by planting faults (scale,
shift, NaN, Inf) in the outputs of chosen ops at a chosen step and call. Reports and dump headers
mark it ``emulation: true``; it is never presented as hardware.

::

    from torchparity_backend_emulated import emulate, Fault
    with emulate(dtype="bfloat16", faults=[Fault(op="aten.mm", phase="forward", call=3)]) as dev:
        train(model)
    print(dev.injections)

    torchparity.dump("dumps/emu", backend="emulated")   # options from plugins.yaml:
    # backends: {options: {emulated: {dtype: bfloat16, faults: [{op: aten.mm, call: 3}]}}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Mapping

from torchparity import hookimpl
from torchparity.errors import PluginError
from torchparity.plugin_types import Availability, DeviceBackend

from .faults import Fault, Injection

if TYPE_CHECKING:  # pragma: no cover
    from .mode import EmulatedDeviceMode

__version__ = "0.1.0"
__all__ = ["emulate", "Fault", "Injection", "EmulatedBackend", "EmulatedDeviceMode", "active_emulation"]


def __getattr__(name: str) -> Any:
    # torch is imported only when the emulation is used, so plugin discovery stays cheap
    if name in ("emulate", "EmulatedDeviceMode", "active_emulation", "resolve_dtype"):
        from . import mode

        return getattr(mode, name)
    raise AttributeError(f"module 'torchparity_backend_emulated' has no attribute '{name}'")


_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                "half": "float16"}


class EmulatedBackend(DeviceBackend):
    """A device emulated on the CPU: reduced-precision compute and planted faults.

    Options (``plugins.yaml`` → ``backends.options.emulated``):
        dtype: ``bfloat16`` (default), ``float16`` or ``null`` (full precision, faults only).
        faults: list of fault mappings (keys of :class:`Fault`: op, module, phase, call, step,
            kind, factor, value, index, output).
    """

    name = "emulated"
    device_type = "cpu"
    is_emulation = True
    description = "EMULATION on the CPU (not hardware): bf16/fp16 compute and planted faults, for tests and demos"

    @dataclass
    class Options:
        #: compute dtype of the emulated device: bfloat16, float16 or null (full precision)
        dtype: Any = "bfloat16"
        #: faults to plant (mappings with the keys of Fault)
        faults: list = field(default_factory=list)

    def __init__(self) -> None:
        super().__init__()
        #: the mode of the last activate() (its ``injections`` say which faults fired)
        self.mode: EmulatedDeviceMode | None = None

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        d = self.options.dtype
        if d is not None and (not isinstance(d, str) or d not in _DTYPE_NAMES):
            raise PluginError(f"backend 'emulated': dtype must be bfloat16, float16 or null, got {d!r}")
        if not isinstance(self.options.faults, (list, tuple)):
            raise PluginError("backend 'emulated': faults must be a list of mappings like {op: aten.mm, call: 0}")
        self.fault_specs()  # validate now: a typo in plugins.yaml is reported at load time

    @property
    def dtype_name(self) -> str | None:
        d = self.options.dtype
        return _DTYPE_NAMES.get(d) if isinstance(d, str) else None

    def fault_specs(self) -> list[Fault]:
        return [Fault.from_mapping(f) for f in self.options.faults or ()]

    def is_available(self) -> Availability:
        return Availability(True)

    def synchronize(self) -> None:
        return None

    def activate(self) -> ContextManager[Any]:
        """The emulation context (an :class:`EmulatedDeviceMode`) with this backend's options."""
        from .mode import EmulatedDeviceMode

        self.mode = EmulatedDeviceMode(self.dtype_name, self.fault_specs())
        return self.mode

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env["emulation"] = True
        env["emulated_dtype"] = self.dtype_name
        env["device_name"] = f"emulated device on the CPU ({self.dtype_name or 'full precision'})"
        env["faults"] = [f.to_dict() for f in self.fault_specs()]
        return env


@hookimpl
def torchparity_backends():
    yield EmulatedBackend()
