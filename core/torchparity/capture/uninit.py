"""Which storages still hold uninitialised memory: made by ``empty*`` and not written since.

MoE routers do ``inv = empty_like(perm); inv[perm] = arange(...)``: the in-place ``index_put_``
receives ``inv`` as an input while its bytes are whatever the allocator left there. Measured, that
garbage differs run to run and two identical clean dumps "diverge" on it. The aten capture marks
the storage of every result of an uninitialised factory and unmarks it at the first op that writes
it (any in-place or ``out=`` write) or that returns a new tensor in the same memory (the allocator
reused the block); until then every tensor on that storage is described but not measured.

Cheap: one set of storage addresses, empty in most programs; the per-op work is skipped while it
is empty.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .ops import storage_ptr

_LIMIT = 100_000  # a program that keeps this many empty buffers unwritten is not one we can follow


class UninitStorages:
    """Set of storage addresses holding uninitialised memory."""

    __slots__ = ("_ptrs",)

    def __init__(self) -> None:
        self._ptrs: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._ptrs)

    def __len__(self) -> int:
        return len(self._ptrs)

    def mark(self, tensors: Iterable[Any]) -> None:
        """These tensors were just returned by an uninitialised factory (``empty``, ``empty_like``...)."""
        if len(self._ptrs) >= _LIMIT:
            self._ptrs.clear()
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                p = storage_ptr(t)
                if p:
                    self._ptrs.add(p)

    def written(self, tensors: Iterable[Any]) -> None:
        """These tensors were written (or freshly produced): their memory now holds values."""
        if not self._ptrs:
            return
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._ptrs.discard(storage_ptr(t))

    def holds(self, t: torch.Tensor) -> bool:
        """True if ``t`` lives on a storage that no op has written since an ``empty*`` made it."""
        return bool(self._ptrs) and storage_ptr(t) in self._ptrs

    def clear(self) -> None:
        self._ptrs.clear()
