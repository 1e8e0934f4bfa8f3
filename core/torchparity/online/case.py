"""Failure cases: one failing op saved so that it can be re-run alone (``torchparity replay``).

A case is a directory::

    CASE/
      case.json            # op, where it ran, arguments (tensors as references), verdict, metrics
      tensors.safetensors  # "in.N" inputs as they were before the op, "out.N" device outputs,
                           # "rng.cpu" the CPU RNG state

Only JSON and safetensors: nothing is unpickled when a case is read.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError

CASE_FORMAT = "torchparity-case"
CASE_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str, limit: int = 120) -> str:
    """A file-name-safe version of ``name`` (no separators, no leading dots)."""
    s = _UNSAFE.sub("_", name).strip("._") or "case"
    return s[:limit]


class _Encoder:
    """Arguments -> JSON, tensors -> ``in.N`` keys (shared tensors stored once)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tensors: dict[str, torch.Tensor] = {}
        self._ids: dict[int, str] = {}

    def encode(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = self._ids.get(id(x))
            if key is None:
                key = f"{self.prefix}.{len(self._ids)}"
                self._ids[id(x)] = key
                self.tensors[key] = x.detach().to("cpu").contiguous()
            return {"$tensor": key, "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape),
                    "device": str(x.device)}
        if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": str(x)}
        if isinstance(x, torch.dtype):
            return {"$dtype": str(x).replace("torch.", "")}
        if isinstance(x, torch.device):
            return {"$device": str(x)}
        if isinstance(x, (torch.layout, torch.memory_format)):
            return {"$torch": str(x).replace("torch.", "")}
        if isinstance(x, tuple):
            return {"$tuple": [self.encode(v) for v in x]}
        if isinstance(x, list):
            return [self.encode(v) for v in x]
        if isinstance(x, dict):
            return {"$dict": {str(k): self.encode(v) for k, v in x.items()}}
        raise TypeError(f"cannot save an argument of type {type(x).__name__}")


def _decode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if not isinstance(x, dict):
        return x
    if "$tensor" in x:
        key = x["$tensor"]
        if key not in tensors:
            raise UsageError(f"case is incomplete: tensor {key!r} is missing from tensors.safetensors")
        return tensors[key]
    if "$float" in x:
        return float(x["$float"])
    if "$dtype" in x:
        return _torch_attr(x["$dtype"], torch.dtype)
    if "$device" in x:
        return torch.device(x["$device"])
    if "$torch" in x:
        return _torch_attr(x["$torch"], (torch.layout, torch.memory_format))
    if "$tuple" in x:
        return tuple(_decode(v, tensors) for v in x["$tuple"])
    if "$dict" in x:
        return {k: _decode(v, tensors) for k, v in x["$dict"].items()}
    raise UsageError(f"case.json holds an unknown value {x!r}")


def _torch_attr(name: str, kind: Any) -> Any:
    v = getattr(torch, str(name), None)
    if not isinstance(v, kind):
        raise UsageError(f"case.json names an unknown torch value {name!r}")
    return v


def resolve_op(name: str) -> Any:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default`` (a clear error if absent)."""
    parts = str(name).split(".")
    if len(parts) != 3:
        raise UsageError(f"case names op {name!r}; expected namespace.op.overload like aten.mm.default")
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        raise UsageError(f"op {name!r} does not exist in this PyTorch ({torch.__version__}); "
                         "is the vendor extension that defines it imported?") from None


def save_case(directory: Path, meta: dict[str, Any], args: tuple, kwargs: dict,
              device_outputs: list[torch.Tensor | None]) -> Path:
    """Write one case (see module doc); returns its directory."""
    from safetensors.torch import save_file

    enc = _Encoder("in")
    meta = dict(meta)
    meta["format"], meta["version"] = CASE_FORMAT, CASE_VERSION
    meta["args"] = enc.encode(list(args))
    meta["kwargs"] = enc.encode(dict(kwargs))["$dict"]
    tensors = dict(enc.tensors)
    meta["outputs"] = []
    for i, t in enumerate(device_outputs):
        if t is None:
            meta["outputs"].append(None)
        else:
            tensors[f"out.{i}"] = t.detach().to("cpu").contiguous()
            meta["outputs"].append({"key": f"out.{i}", "dtype": str(t.dtype).replace("torch.", ""),
                                    "shape": list(t.shape), "device": str(t.device)})
    tensors["rng.cpu"] = torch.get_rng_state()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "tensors.safetensors"))
    (directory / "case.json").write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    return directory


def load_case(path: str | Path) -> tuple[dict[str, Any], tuple, dict, list[torch.Tensor | None], dict[str, torch.Tensor]]:
    """Read a case directory (or its case.json): (meta, args, kwargs, device outputs, all tensors)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    d = p.parent if p.name == "case.json" else p
    if not (d / "case.json").is_file():
        raise UsageError(f"{path}: not a torchparity failure case (no case.json); cases are written by "
                         "CompareWithReference(save_failures=DIR)")
    try:
        meta = json.loads((d / "case.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{d / 'case.json'}: unreadable ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != CASE_FORMAT:
        raise UsageError(f"{d / 'case.json'}: not a torchparity case (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    version = meta.get("version", 0)
    if type(version) is not int:
        raise UsageError(f"{d / 'case.json'}: 'version' is {version!r:.40}, not an integer; the case is damaged")
    if version > CASE_VERSION:
        raise UsageError(f"{d}: case version {meta.get('version')} is newer than this torchparity reads ({CASE_VERSION})")
    for key, kind in (("args", list), ("kwargs", dict), ("outputs", list)):
        if not isinstance(meta.get(key, kind()), kind):
            raise UsageError(f"{d / 'case.json'}: '{key}' is {type(meta.get(key)).__name__}, not a "
                             f"{kind.__name__}; the case is damaged")
    try:
        tensors = load_file(str(d / "tensors.safetensors"))
    except (OSError, SafetensorError, ValueError) as exc:
        raise UsageError(f"{d / 'tensors.safetensors'}: unreadable ({' '.join(str(exc).split())[:200]})") from None
    try:
        args = tuple(_decode(meta.get("args", []), tensors))
        kwargs = {str(k): _decode(v, tensors) for k, v in (meta.get("kwargs") or {}).items()}
        outs = [None if o is None else tensors.get(o["key"]) for o in meta.get("outputs", [])]
    except UsageError as exc:
        raise UsageError(f"{d / 'case.json'}: {exc}") from None
    except (TypeError, KeyError, ValueError, AttributeError, RuntimeError) as exc:
        raise UsageError(f"{d / 'case.json'}: a value of the wrong type ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:120]}); the case is damaged - save it again") from None
    return meta, args, kwargs, outs, tensors
