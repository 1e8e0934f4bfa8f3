"""Rebuilding one recorded op call for a replay: resolve the op from its recorded name (allow-listed
torch namespaces only, never ``eval`` or an import of a recorded name) and its arguments from the
record's entries (saved tensors read from safetensors, scalars from their recorded values).

Used by :mod:`.replay_judge`; nothing here runs an op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

#: a Python identifier (each dotted component of a recorded op name must be one)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: api-level namespaces whose functions may be replayed (the recorded name's prefix picks one)
API_NAMESPACES = ("torch.nn.functional", "torch.Tensor", "torch.special", "torch.linalg", "torch.fft", "torch")
#: dunder methods of ``torch.Tensor`` that are plain arithmetic
_TENSOR_DUNDERS = frozenset({
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__matmul__", "__rmatmul__", "__pow__", "__rpow__", "__neg__", "__abs__", "__floordiv__", "__rfloordiv__",
    "__mod__", "__getitem__"})
#: names (api or aten base) that draw random numbers: a replay would draw others
_RANDOM = re.compile(r"(dropout|^rand|bernoulli|multinomial|^normal|poisson|rrelu|gumbel|uniform_|exponential_|"
                     r"geometric_|cauchy_|log_normal_|random_)")
#: names with effects beyond their result, or whose result depends on memory layout not recorded
_NO_REPLAY = re.compile(r"(^set_|resize|record_stream|^_assert|^print|as_strided|^_local_scalar|^item$|^save$|"
                        r"^load$|seed|^empty|^new_empty|^backward$|^register|^requires_grad_|^retain_grad|^data_ptr)")
#: floating dtype names as recorded; their values are upcast for the replay
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"})
#: unmeasured-input reasons (``flags.unmeasured``) whose content the op does not read
_NOT_READ = ("overwritten by the op", "out= buffer")
_DEVICE = re.compile(r"^(cpu|cuda|npu|musa|maca|xpu|mps|hpu|meta|privateuseone)(:\d+)?$")


class CannotReplay(Exception):
    """Why an op cannot be replayed (the message completes "cannot replay: ...")."""


@dataclass
class Call:
    """A rebuilt call: the op and its arguments (tensors as recorded, on the CPU)."""

    fn: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    schema: Any = None  # the aten schema (None at api level)


def base_name(op: str, level: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``torch.nn.functional.gelu`` -> ``gelu``."""
    parts = op.split(".")
    if level == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-1]


def resolve(op: str, level: str) -> tuple[Callable[..., Any], Any]:
    """The callable of a recorded op name and its schema (aten), or :class:`CannotReplay`.

    Only ``aten.<op>.<overload>`` (looked up in ``torch.ops.aten``) and functions of
    :data:`API_NAMESPACES` are resolved, component by component with ``getattr`` on those
    objects: a recorded name never reaches ``eval`` or ``import``."""
    import torch

    parts = op.split(".")
    if not parts or not all(_IDENT.match(p) for p in parts):
        raise CannotReplay(f"'{op}' is not an op name torchparity can resolve")
    base = base_name(op, level)
    if _RANDOM.search(base):
        raise CannotReplay(f"{base} draws random numbers (a replay would draw others)")
    if _NO_REPLAY.search(base):
        raise CannotReplay(f"{base} has effects beyond its result or depends on memory layout")
    if level == "aten":
        if len(parts) != 3 or parts[0] != "aten":
            raise CannotReplay(f"'{op}' is not an aten op (only aten.<op>.<overload> is replayed at aten level)")
        try:
            fn = getattr(getattr(torch.ops.aten, parts[1]), parts[2])
        except (AttributeError, RuntimeError):
            raise CannotReplay(f"this torch ({torch.__version__}) has no op {op}") from None
        return fn, getattr(fn, "_schema", None)
    if level != "api":
        raise CannotReplay(f"a {level}-level record is not one op (dump at aten or api level to replay it)")
    for ns in API_NAMESPACES:
        if op.startswith(ns + ".") and len(op.split(".")) == len(ns.split(".")) + 1:
            name = parts[-1]
            if name.startswith("_") and not (ns == "torch.Tensor" and name in _TENSOR_DUNDERS):
                raise CannotReplay(f"'{op}' is private: only public functions are replayed")
            if name.endswith("_") and not name.endswith("__"):
                raise CannotReplay(f"'{op}' works in place on its argument at api level")
            obj: Any = torch
            for p in ns.split(".")[1:]:
                obj = getattr(obj, p, None)
            fn = getattr(obj, name, None)
            if not callable(fn):
                raise CannotReplay(f"this torch ({torch.__version__}) has no function {op}")
            return fn, None
    raise CannotReplay(f"'{op}' is outside the namespaces replayed ({', '.join(API_NAMESPACES)})")


def scalar_value(value: Any, arg: str) -> Any:
    """A recorded scalar as the op wants it: dtype/device/layout names back to torch objects
    (looked up as attributes of ``torch``, checked to be of those types), ``"nan"``/``"inf"``
    back to floats. Devices become ``cpu`` (the replay runs on the CPU)."""
    import torch

    if isinstance(value, list):
        return [scalar_value(v, arg) for v in value]
    if not isinstance(value, str):
        return value
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if value.startswith("torch.") and _IDENT.match(value[6:]):
        obj = getattr(torch, value[6:], None)
        if isinstance(obj, (torch.dtype, torch.memory_format, torch.layout)):
            return obj
    if _DEVICE.match(value) and (arg == "device" or ":" in value or value in ("cpu", "cuda", "npu")):
        return torch.device("cpu")
    return value


def build_call(entries: list[dict[str, Any]], fn: Callable[..., Any], schema: Any, load: Callable[[Any], Any],
               unmeasured: dict[str, str]) -> Call:
    """The call recorded by a record's input entries (``io == "input"``, in recorded order).

    Positional arguments ``"0"``, ``"1"``...; list elements ``"0.1"``; keywords by name. A gap in
    the positions, a tensor that was not saved, or a required schema argument that was not
    recorded is a :class:`CannotReplay` naming it."""
    import torch

    pos: dict[int, Any] = {}
    kw: dict[str, Any] = {}
    lists: dict[str, dict[int, Any]] = {}
    for e in entries:
        arg = str(e["arg"])
        if e["kind"] == "tensor":
            ref = e.get("tensor")
            if ref is None or isinstance(ref, float):
                why = unmeasured.get(f"input.{arg}")
                if why in _NOT_READ:  # the op overwrites it: its content does not matter
                    val = torch.zeros(tuple(e["shape"]), dtype=getattr(torch, str(e["dtype"])))
                else:
                    raise CannotReplay(f"input {arg} was not saved ({why or 'not in the dump'})")
            else:
                val = load(ref)
        elif e["kind"] == "none":
            val = None
        else:
            val = scalar_value(e.get("value"), arg)
        head, _, tail = arg.partition(".")
        if tail:
            if not tail.isdigit():
                raise CannotReplay(f"argument '{arg}' is nested deeper than a list")
            lists.setdefault(head, {})[int(tail)] = val
        elif head.isdigit():
            pos[int(head)] = val
        else:
            kw[head] = val
    for head, items in lists.items():
        if sorted(items) != list(range(len(items))):
            raise CannotReplay(f"list argument '{head}' was recorded incompletely")
        val = [items[j] for j in range(len(items))]
        if head.isdigit():
            pos[int(head)] = val
        else:
            kw[head] = val
    if sorted(pos) != list(range(len(pos))):
        missing = min(set(range(max(pos) + 1)) - set(pos))
        raise CannotReplay(f"positional argument {missing} was not recorded (a value the dump cannot describe)")
    args = [pos[i] for i in range(len(pos))]
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            given = a.name in kw or (not a.kwarg_only and i < len(args))
            if not given and not a.has_default_value():
                raise CannotReplay(f"argument '{a.name}' of {schema.name} was not recorded")
    return Call(fn, args, kw, schema)
