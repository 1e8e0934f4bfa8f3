"""Op records: what is captured for each op call, and how it is written as JSON.

A record is one call of one op (a module forward, an API call, an aten kernel, a collective) in
one phase of one step on one rank. It carries a description of each tensor argument and result
(:class:`TensorEntry`) with statistics, optionally a checksum and a reference to the saved tensor.
Records are written as JSON Lines (one object per line) by the dump writer and read back by
:func:`torchparity.load_dump`; the JSON schema is documented in ``docs/dump-format.md``.

Non-finite floats are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` so the
files are strict JSON (readable by any JSON parser, unlike msprobe's bare ``NaN`` tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

FORMAT_NAME = "torchparity-dump"
FORMAT_VERSION = 1

LEVELS = ("module", "api", "aten", "mix")
PHASES = ("forward", "backward", "optimizer", "recompute")
MODES = ("statistics", "md5", "tensor")
IO_KINDS = ("input", "output", "param", "grad")
STAT_KEYS = ("max", "min", "mean", "norm", "nan", "inf")

#: Name prefixes by capture source (msprobe-compatible where msprobe has one).
PREFIX_MODULE = "Module"
PREFIX_ATEN = "Aten"
PREFIX_FUNCTIONAL = "Functional"
PREFIX_TORCH = "Torch"
PREFIX_TENSOR = "Tensor"
PREFIX_DISTRIBUTED = "Distributed"


def encode_float(x: float | None) -> float | str | None:
    """A float as strict JSON: finite floats as numbers, others as strings."""
    if x is None:
        return None
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


_DECODE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def decode_float(x: Any) -> float | None:
    """Inverse of :func:`encode_float` (also accepts numbers and None)."""
    if x is None:
        return None
    if isinstance(x, str):
        return _DECODE.get(x, math.nan)
    return float(x)


@dataclass
class TensorEntry:
    """One tensor (or scalar) argument or result of an op call.

    ``arg`` is the position in the op's flattened arguments or results: ``"0"``, ``"1"``, a kwarg
    name (``"alpha"``), or a pytree path for nested structures (``"0.1"``); for parameters
    ``"weight"``. ``producer`` is ``[record_id, output_index]`` of the op (same step and rank)
    that produced this tensor, when known: the data flow that root-cause analysis follows.
    """

    io: str  # input | output | param | grad
    arg: str
    kind: str = "tensor"  # tensor | scalar | none
    dtype: str | None = None  # "float32", "bfloat16", ... (no "torch." prefix)
    # lists when read back; the capture hands over the tensor's own ``torch.Size`` and stride
    # tuple (no per-value copy on the training thread), written as the same JSON arrays
    shape: Sequence[int] | None = None
    stride: Sequence[int] | None = None
    device: str | None = None
    requires_grad: bool | None = None
    stats: dict[str, float | None] | None = None  # STAT_KEYS
    md5: str | None = None
    file: str | None = None  # tensors/000001.safetensors (relative to the rank dir)
    key: str | None = None  # tensor name inside that file
    producer: list[int] | None = None
    value: Any = None  # scalars: the value (JSON-able); tensors: None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "tensor":
            shape, stride = self.shape, self.stride
            d: dict[str, Any] = {"io": self.io, "arg": self.arg, "kind": "tensor", "dtype": self.dtype,
                                 "shape": None if shape is None else list(shape),
                                 "stride": None if stride is None else list(stride), "device": self.device,
                                 "requires_grad": self.requires_grad}
            if self.stats is not None:
                d["stats"] = {k: v if v.__class__ is float and v - v == 0 else encode_float(v)
                              for k, v in self.stats.items()}
            if self.md5 is not None:
                d["md5"] = self.md5
            if self.file is not None:
                d["file"], d["key"] = self.file, self.key
            if self.producer is not None:
                d["producer"] = self.producer
        else:
            d = {"io": self.io, "arg": self.arg, "kind": self.kind, "value": self.value}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorEntry:
        stats = d.get("stats")
        return cls(
            io=d["io"], arg=str(d["arg"]), kind=d.get("kind", "tensor"), dtype=d.get("dtype"),
            shape=d.get("shape"), stride=d.get("stride"), device=d.get("device"),
            requires_grad=d.get("requires_grad"),
            stats={k: decode_float(v) for k, v in stats.items()} if stats else None,
            md5=d.get("md5"), file=d.get("file"), key=d.get("key"), producer=d.get("producer"),
            value=d.get("value"),
        )


_new = object.__new__


def tensor_entry(io: str, arg: str, dtype: str, shape: Sequence[int], stride: Sequence[int] | None,
                 device: str, requires_grad: bool) -> TensorEntry:
    """A tensor's :class:`TensorEntry`, made the fast way (the capture's hot path: a few hundred
    ns instead of the dataclass ``__init__``'s keyword handling). The fields not given keep the
    class defaults (None, ``kind="tensor"``) until assigned: equal to ``TensorEntry(...)``."""
    e = _new(TensorEntry)
    e.io, e.arg, e.dtype, e.shape, e.stride, e.device, e.requires_grad = \
        io, arg, dtype, shape, stride, device, requires_grad
    return e


def scalar_entry(io: str, arg: str, kind: str, value: Any) -> TensorEntry:
    """A scalar or None argument's :class:`TensorEntry` (``kind`` "scalar" or "none"), made fast."""
    e = _new(TensorEntry)
    e.io, e.arg, e.kind, e.value = io, arg, kind, value
    return e


@dataclass
class OpRecord:
    """One op call. ``id`` is its position in execution order within (step, rank), from 0."""

    id: int
    name: str  # stable readable name, e.g. "Aten.mm.12.backward"
    op: str  # "aten.mm.default", "torch.nn.functional.linear", "Linear" (module class)
    level: str  # module | api | aten
    phase: str  # forward | backward | optimizer | recompute
    module: str  # module path ("layers.0.self_attn.q_proj"; "" outside any module)
    call_index: int  # index among calls of the same op in the same module and phase, this step
    step: int
    rank: int
    module_class: str | None = None
    fwd: int | None = None  # backward records: id of the forward record that created the node
    stack: int | None = None  # id into stacks.jsonl
    tensors: list[TensorEntry] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)  # inplace, collective, random, upcast...

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "name": self.name, "op": self.op, "level": self.level, "phase": self.phase,
            "module": self.module, "module_class": self.module_class, "call_index": self.call_index,
            "step": self.step, "rank": self.rank, "fwd": self.fwd, "stack": self.stack,
            "tensors": [t.to_json() for t in self.tensors],
        }
        if self.flags:
            d["flags"] = self.flags
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OpRecord:
        return cls(
            id=int(d["id"]), name=d["name"], op=d["op"], level=d["level"], phase=d["phase"],
            module=d.get("module") or "", call_index=int(d.get("call_index", 0)), step=int(d["step"]),
            rank=int(d["rank"]), module_class=d.get("module_class"), fwd=d.get("fwd"),
            stack=d.get("stack"), tensors=[TensorEntry.from_json(t) for t in d.get("tensors", [])],
            flags=d.get("flags") or {},
        )


def op_record(id: int, name: str, op: str, level: str, phase: str, module: str, call_index: int, step: int,
              rank: int, module_class: str | None, fwd: int | None, stack: int | None,
              flags: dict[str, Any]) -> OpRecord:
    """An :class:`OpRecord` with no tensors yet, made the fast way (see :func:`tensor_entry`)."""
    r = _new(OpRecord)
    r.id, r.name, r.op, r.level, r.phase, r.module, r.call_index, r.step, r.rank = \
        id, name, op, level, phase, module, call_index, step, rank
    r.module_class, r.fwd, r.stack, r.tensors, r.flags = module_class, fwd, stack, [], flags
    return r


def record_name(prefix: str, base: str, counter: int, phase: str) -> str:
    """``Aten.mm.3.forward`` style names; modules use :func:`module_record_name`."""
    return f"{prefix}.{base}.{counter}.{phase}"


def module_record_name(path: str, cls_name: str, phase: str, counter: int) -> str:
    """``Module.layers.0.mlp.MLP.forward.0`` (msprobe's module naming: index after the phase)."""
    return f"{PREFIX_MODULE}.{path + '.' if path else ''}{cls_name}.{phase}.{counter}"
