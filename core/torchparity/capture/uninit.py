"""Which storages still hold uninitialised memory: made by ``empty*`` and not written since.

MoE routers do ``inv = empty_like(perm); inv[perm] = arange(...)``: the in-place ``index_put_``
receives ``inv`` as an input while its bytes are whatever the allocator left there. Measured, that
garbage differs run to run and two identical clean dumps "diverge" on it. The aten capture marks
the storage of every result of an uninitialised factory and unmarks it at the first op that writes
it (any in-place or ``out=`` write) or that returns a new tensor in the same memory (the allocator
reused the block); until then every tensor on that storage is described but not measured.

The API-level capture (levels ``api`` and ``mix``) keeps the same set with :meth:`UninitStorages.after_call`:
it sees ``torch.empty_like`` and ``inv[perm] = ...`` as the user wrote them, but not which calls
return views, so a result counts as fresh memory only when its storage is none of the call's inputs'.

A write the capture did not see (an API the function mode is not told about on an older torch:
``Tensor.__setitem__`` on torch 2.1) must not leave real values unmeasured: each marked storage
keeps the version counter of the tensor that marked it (shared by all its views and bumped by
every in-place write), and a read that finds another version unmarks it.

Cheap: one dict of storage addresses, empty in most programs; the per-op work is skipped while it
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
        self._ptrs: dict[int, int] = {}  # storage address -> version counter when marked (-1: unknown)

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
                    self._ptrs[p] = _version(t)

    def written(self, tensors: Iterable[Any]) -> None:
        """These tensors were written (or freshly produced): their memory now holds values."""
        if not self._ptrs:
            return
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._ptrs.pop(storage_ptr(t), None)

    def after_call(self, factory: bool, outputs: Iterable[Any], written: Iterable[Any] = (),
                   inputs: Iterable[Any] | None = None) -> None:
        """Bookkeeping after one op or API call returned (the one rule both capture levels follow).

        ``factory``: the call was ``empty*``, its results are uninitialised. Otherwise the
        tensors in ``written`` were written (in-place, ``out=``, index assignment) and every result
        that is fresh memory now holds values. With ``inputs`` (API level, where views are not
        known from a schema) a result on the storage of one of the inputs is a view or the
        written input itself, not fresh memory; without it every result is fresh (the aten caller
        leaves views out). Nothing is done while no storage is marked.
        """
        if factory:
            self.mark(outputs)
            return
        if not self._ptrs:
            return
        self.written(written)
        if inputs is None:
            self.written(outputs)
            return
        outs = [o for o in outputs if isinstance(o, torch.Tensor)]
        if not outs:
            return
        shared = {storage_ptr(t) for t in inputs if isinstance(t, torch.Tensor)}
        for o in outs:
            p = storage_ptr(o)
            if p not in shared:
                self._ptrs.pop(p, None)

    def held(self, tensors: Iterable[Any]) -> list[tuple[int, int]]:
        """The storages among ``tensors`` that are marked now, with their versions (to
        :meth:`restore` after a conservative :meth:`written` over arguments that were only read)."""
        if not self._ptrs:
            return []
        out = []
        for t in tensors:
            if isinstance(t, torch.Tensor):
                p = storage_ptr(t)
                if p in self._ptrs:
                    out.append((p, self._ptrs[p]))
        return out

    def restore(self, held: Iterable[tuple[int, int]]) -> None:
        """Mark again storages returned by :meth:`held`."""
        self._ptrs.update(held)

    def holds(self, t: torch.Tensor) -> bool:
        """True if ``t`` lives on a storage that no op has written since an ``empty*`` made it
        (a version counter that moved on means a write the capture did not see: unmarked)."""
        if not self._ptrs:
            return False
        p = storage_ptr(t)
        v = self._ptrs.get(p)
        if v is None:
            return False
        if v >= 0 and _version(t) != v:
            del self._ptrs[p]
            return False
        return True

    def clear(self) -> None:
        self._ptrs.clear()


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter (shared with its views), or -1 where it has none (inference
    tensors)."""
    try:
        return int(t._version)
    except (RuntimeError, AttributeError):
        return -1
