"""Arguments and results of an intercepted call as flat ``(name, value)`` pairs."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.utils._pytree import tree_flatten

#: argument positions as names, made once ("0", "1", ...)
_POS = tuple(str(i) for i in range(256))


def flat_args(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(arg path, value) pairs for positional and keyword arguments, nested ones flattened.

    The hot path of every captured op: a plain tensor or scalar argument is told apart by its
    class (no ``isinstance`` on a tuple of types, no generator per list argument)."""
    out: list[tuple[str, Any]] = []
    append = out.append
    i = 0
    for a in args:
        c = a.__class__
        if c is Tensor or c in _PLAIN:
            append((_POS[i] if i < 256 else str(i), a))
        elif isinstance(a, (list, tuple)) and a and _has_tensor(a):
            out.extend((f"{i}.{j}", x) for j, x in enumerate(a))
        else:
            append((_POS[i] if i < 256 else str(i), a))
        i += 1
    if kwargs:
        for k, v in kwargs.items():
            if isinstance(v, (list, tuple)) and v and _has_tensor(v):
                out.extend((f"{k}.{j}", x) for j, x in enumerate(v))
            else:
                append((k, v))
    return out


#: argument classes that are never a list of tensors (checked by identity, subclasses excluded)
_PLAIN = frozenset({int, float, bool, str, type(None)})


def _has_tensor(seq: Any) -> bool:
    """Does the list or tuple hold a tensor? (a loop: cheaper than ``any`` over a generator)"""
    for x in seq:
        if isinstance(x, Tensor):
            return True
    return False


def flat_outputs(out: Any) -> list[tuple[str, Any]]:
    """(output index, value) pairs; nested outputs flattened in pytree order."""
    if isinstance(out, Tensor):  # the common case; tree_flatten takes ~10 us for it
        return [("0", out)]
    if isinstance(out, (tuple, list)) and not any(isinstance(v, (tuple, list, dict)) for v in out):
        return [(_POS[i] if i < 256 else str(i), v) for i, v in enumerate(out)]
    leaves, _ = tree_flatten(out)
    return [(_POS[i] if i < 256 else str(i), v) for i, v in enumerate(leaves)]
