"""A memo of per-tensor facts that never keeps a tensor alive."""

from __future__ import annotations

from typing import Any
from weakref import ref as _weakref

import torch


class TensorMemo:
    """Per-step facts about tensors, keyed by the tensor object without keeping it alive.

    A dict from ``id(tensor)`` to ``(weakref, value)``; an entry counts only while its weakref
    still points at the very same tensor, so a recycled id never returns another tensor's value.
    Several times cheaper per lookup than ``torch.utils.weak.WeakIdKeyDictionary`` (no callback,
    no wrapper objects); dead entries are swept when the memo grows large and dropped each step.
    """

    __slots__ = ("_d", "_limit")

    def __init__(self, limit: int = 200_000) -> None:
        self._d: dict[int, tuple[Any, Any]] = {}
        self._limit = limit

    def get(self, t: torch.Tensor) -> Any:
        e = self._d.get(id(t))
        if e is not None and e[0]() is t:
            return e[1]
        return None

    def __contains__(self, t: torch.Tensor) -> bool:
        return self.get(t) is not None

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        d = self._d
        if len(d) >= self._limit:
            for k in [k for k, e in d.items() if e[0]() is None]:
                del d[k]
            if len(d) >= self._limit:
                self._limit *= 2
        d[id(t)] = (_weakref(t), value)

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)
