"""Records of instrumented graph nodes: module path, phase, source op and line, stable id."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

# the traced root: L['self'], or L['args'][0] when Dynamo traces the module through a wrapper
_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\](\[\d+\])?\.?")
_MODULES = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]")
_INDEX = re.compile(r"\[(\d+)\]")


def clean_module_path(path: str) -> str:
    """A Dynamo module path (``L['self']._orig_mod.layers[0].fc1``) as an eager module path
    (``layers.0.fc1``): the traced root, ``_modules[...]`` accessors and ``_orig_mod`` removed."""
    p = _ROOT.sub("", path)
    p = _MODULES.sub(r".\1", p)
    p = _INDEX.sub(r".\1", p)
    parts = [s for s in p.split(".") if s and s != "_orig_mod"]
    return ".".join(parts)


def module_of(meta: dict[str, Any]) -> tuple[str, str | None]:
    """(module path, class name) of the innermost module in ``node.meta["nn_module_stack"]``."""
    stack = meta.get("nn_module_stack") or {}
    if not stack:
        return "", None
    path, cls = list(stack.values())[-1][:2]
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", None)
    if isinstance(name, str) and "." in name:
        name = name.rsplit(".", 1)[-1]
    return clean_module_path(str(path)), name


def source_line(meta: dict[str, Any]) -> str | None:
    """The last frame of ``node.meta["stack_trace"]`` as ``file:line in func`` (None when absent)."""
    trace = meta.get("stack_trace")
    if not trace:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    if not frames:
        return None
    f, line, fn = frames[-1]
    return f"{f}:{line} in {fn}"


def stable_id(module: str, phase: str, op: str, index: int) -> str:
    """A node id that survives recompiles: a hash of module path, phase, source op and the
    occurrence index of that op within (module, phase) in the graph."""
    return hashlib.sha1(f"{module}|{phase}|{op}|{index}".encode()).hexdigest()[:12]


@dataclass
class NodeRecord:
    """One instrumented graph node: where it came from and which extra graph output holds its
    statistics ``[max, min, mean, norm, nan, inf]``."""

    node: str  # the fx node name in the compiled graph
    op: str  # aten op, e.g. "aten.addmm.default"
    phase: str  # "forward" or "backward"
    module: str
    module_class: str | None
    call_index: int
    node_id: str
    source: str | None
    dtype: str
    shape: list[int]
    stride: list[int]
    device: str
    seq_nr: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
