"""torchparity: find where a PyTorch model's numerics diverge between devices.

The public API is imported lazily so that ``import torchparity`` (and the CLI) stay fast and do
not import torch until a capability that needs it is used::

    import torchparity
    with torchparity.dump("dumps/gpu", level="aten", mode="statistics"):
        train_step()
    res = torchparity.compare("dumps/gpu", "dumps/cpu", output_dir="out")
"""

from __future__ import annotations

import importlib
from typing import Any

from .hookspecs import HOOK_API_VERSION, hookimpl

try:
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("torchparity")
except Exception:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

# public name -> "module:attribute", imported on first access
_LAZY = {
    "dump": "torchparity.dump.api:dump",
    "Dumper": "torchparity.dump.api:Dumper",
    "load_dump": "torchparity.dump.reader:load_dump",
    "query": "torchparity.dump.query:query",
    "compact": "torchparity.dump.compact:compact",
    "compare": "torchparity.compare.api:compare",
    "compile_backend": "torchparity.compile.backend:compile_backend",
    "CompareWithReference": "torchparity.online.compare:CompareWithReference",
    "CompareWithCPU": "torchparity.online.compare:CompareWithReference",
    "NanInfTracker": "torchparity.online.naninf:NanInfTracker",
    "replay": "torchparity.online.replay:replay",
    "bisect": "torchparity.bisect:bisect",
    "GradMonitor": "torchparity.gradients.monitor:GradMonitor",
    "watch": "torchparity.watch:watch",
    "ReplicaCheck": "torchparity.replicas.online:ReplicaCheck",
    "check_replicas": "torchparity.replicas.offline:check_replicas",
    "get_registry": "torchparity.plugins:get_registry",
    "op_stream": "torchparity.capture.op_stream:op_stream",
    "OpConsumer": "torchparity.capture.op_stream:OpConsumer",
    "OpCall": "torchparity.capture.op_stream:OpCall",
    "LAYER_OBSERVER": "torchparity.capture.op_stream:LAYER_OBSERVER",
    "LAYER_DEVICE": "torchparity.capture.op_stream:LAYER_DEVICE",
    "TorchparityError": "torchparity.errors:TorchparityError",
    "DeviceBackend": "torchparity.plugin_types:DeviceBackend",
    "Checker": "torchparity.plugin_types:Checker",
    "Reporter": "torchparity.plugin_types:Reporter",
}

__all__ = ["HOOK_API_VERSION", "hookimpl", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'torchparity' has no attribute '{name}'")
    module_name, attr = target.split(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
