"""torchparity backend for MetaX GPUs through MetaX's MACA build of PyTorch.

MetaX ships a PyTorch build whose device type is ``cuda``: models run unchanged on
``torch.device("cuda")`` and ``torch.version.cuda`` is set (to the CUDA API level MACA emulates).
So this backend has ``name = "maca"`` but ``device_type = "cuda"``, reuses the CUDA backend's
numerics switches (the build exposes the same ``torch.backends.cuda`` / ``cudnn`` flags), and differs
in two places:

* :meth:`MacaBackend.is_available` requires a MetaX marker (see
  :func:`torchparity_backend_cuda.metax_markers`); the CUDA backend refuses exactly when one is
  present, so a GPU is claimed by one backend only;
* :meth:`MacaBackend.environment` writes ``vendor: MetaX``, the MACA version and the markers seen,
  so a dump header says which hardware produced it even though both say ``device_type: cuda``.

Evidence and uncertainty are documented in ``docs/backends.md`` (section maca).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torchparity import hookimpl
from torchparity.plugin_types import Availability
from torchparity_backend_cuda import CudaBackend, metax_markers, strong_metax_markers

__version__ = "0.1.0"


class MacaBackend(CudaBackend):
    """MetaX GPUs (MACA PyTorch build, device type ``cuda``)."""

    name = "maca"
    device_type = "cuda"
    description = "MetaX GPUs via the MACA PyTorch build (device type cuda, detected by vendor markers)"

    def is_available(self) -> Availability:
        try:
            import torch

            markers = metax_markers(probe_device=False)
            strong = strong_metax_markers(markers)
            if not strong:
                hint = " (MACA_PATH is set, but this torch is not MetaX's build)" if markers else ""
                return Availability(
                    False,
                    "no MetaX MACA PyTorch build found: torch.version.maca is unset and no torch_maca/mcpytorch "
                    f"module{hint}; install MetaX's torch wheels",
                )
            if "module:torch_maca" in strong and "torch.version.maca" not in strong and "torch_maca" not in sys.modules:
                # some MACA releases register the device from an extension module
                import torch_maca  # noqa: F401
            if not torch.cuda.is_available():
                return Availability(False, "MetaX MACA torch found, but no MetaX GPU is visible (torch.cuda.is_available() is False)")
        except Exception as exc:
            return Availability(False, f"probing MetaX MACA failed: {type(exc).__name__}: {exc}")
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        import torch

        env = super().environment()
        markers = metax_markers(probe_device=True)
        env.update(
            vendor="MetaX",
            maca_version=getattr(torch.version, "maca", None),
            # what torch.version.cuda says on MACA is the emulated CUDA API level, not a CUDA install
            cuda_compat_version=env.pop("cuda_runtime_version", None),
            maca_path=os.environ.get("MACA_PATH"),
            vendor_markers=markers,
        )
        env.pop("driver_version", None)  # libcuda's answer would not be MetaX's driver
        mod = sys.modules.get("torch_maca")
        if mod is not None:
            env["torch_maca_version"] = getattr(mod, "__version__", None)
        return env


@hookimpl
def torchparity_backends():
    yield MacaBackend()
