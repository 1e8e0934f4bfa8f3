"""torchparity's CPU reference backend.

The CPU is the reference every other device is compared against: online compare re-runs ops here,
and with ``fp64: true`` (the default) it computes a float64 reference so that a low-precision
device is judged against the true value rather than against another rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from torchparity import hookimpl
from torchparity.plugin_types import Availability, DeviceBackend

if TYPE_CHECKING:  # pragma: no cover
    import torch

__version__ = "0.1.0"


class CpuBackend(DeviceBackend):
    """The CPU, through stock PyTorch. Always available."""

    name = "cpu"
    device_type = "cpu"
    description = "CPU reference (stock PyTorch); fp64 reference computations"

    @dataclass
    class Options:
        #: compute the high-precision reference in float64 (else float32)
        fp64: bool = True
        #: torch.set_num_threads for reference runs (0 = leave as is)
        threads: int = 0

    def is_available(self) -> Availability:
        return Availability(True)

    def synchronize(self) -> None:  # CPU ops are synchronous
        return None

    def reference_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a high-precision reference of a ``dtype`` computation is done in."""
        import torch

        if not dtype.is_floating_point and not dtype.is_complex:
            return dtype
        if dtype.is_complex:
            return torch.complex128 if self.options.fp64 else torch.complex64
        return torch.float64 if self.options.fp64 else torch.float32

    def seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def get_rng_state(self) -> dict[str, torch.Tensor]:
        import torch

        return {"cpu": torch.get_rng_state()}

    def set_rng_state(self, state: Mapping[str, torch.Tensor]) -> None:
        import torch

        torch.set_rng_state(state["cpu"])

    def numerics_switches(self) -> dict[str, Any]:
        import torch

        switches = super().numerics_switches()
        switches["num_threads"] = torch.get_num_threads()
        switches["mkldnn_enabled"] = bool(torch.backends.mkldnn.enabled)
        return switches

    def environment(self) -> dict[str, Any]:
        import platform

        env = super().environment()
        env["device_name"] = platform.processor() or platform.machine()
        return env


@hookimpl
def torchparity_backends():
    yield CpuBackend()
