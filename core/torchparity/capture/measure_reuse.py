"""Measure each tensor value once: the capture session's reuse of statistics, checksums and
saved copies, and the producer links of its records.

A tensor is measured once per value: when an op's input is a tensor already measured (an earlier
op's output, a parameter used again) and neither its version counter nor any write to its storage
seen since says it changed, its measurement is reused. Writes through an alias with its own
version counter (``p.data.add_()``) are why a write generation per storage is kept: the aten-level
capture reports every kernel's written arguments (:meth:`MeasurementReuse.note_writes`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from .ranks import _distributed


class MeasurementReuse:
    """Mixin of :class:`~torchparity.capture.session.CaptureSession`: the memo of measurements
    (``_measured``), the write generation per storage (``_write_gen``), the producers of tensors
    (``_producers``), the uninitialised storages (``uninit``) and the ``reuse_stats`` switch are
    the session's attributes."""

    _measured: Any
    _producers: Any
    _write_gen: dict[int, int]
    uninit: Any
    reuse_stats: bool
    _api_reuse: bool

    def _lookup(self, v: torch.Tensor) -> Any:
        hit = self._measured.get(v)
        if hit is not None:
            try:
                if hit[0] == v._version and self._write_gen.get(hit[1], 0) == hit[2]:
                    return hit[3]
            except RuntimeError:  # inference tensors have no version counter
                pass
        return None

    def _remember(self, v: torch.Tensor, measured: tuple[Any, str | None, str | None, tuple[int, ...] | None],
                  version: int | None = None) -> None:
        """Note (statistics, checksum, saved tensor key, its shape) as the measurement of ``v``
        (at ``version``: :func:`view_version`'s for the output of a view op, else its own)."""
        try:
            ptr = v.untyped_storage().data_ptr()
            self._measured[v] = (v._version if version is None else version, ptr, self._write_gen.get(ptr, 0),
                                 measured)
        except (RuntimeError, NotImplementedError, TypeError):  # no storage/version (inference, subclasses)
            pass

    def forget(self) -> None:
        """A capture stops seeing writes (between a scheduled dump's full steps): reuse nothing,
        and drop what was remembered (measurements, write generations, storages not yet
        written), which the unseen writes may make wrong. Reuse comes back with the capture."""
        self.reuse_stats = False
        self._measured.clear()
        self._write_gen.clear()
        self.uninit.clear()

    def enable_api_reuse(self) -> None:
        """The API-level mode watches Python-level writes: reuse measurements (single process)."""
        self._api_reuse = True
        if not _distributed():
            self.reuse_stats = True

    def note_writes(self, tensors: Iterable[Any]) -> None:
        """An op wrote into these tensors: statistics measured through any alias are stale (and
        their memory is no longer uninitialised)."""
        tensors = list(tensors)
        self.uninit.written(tensors)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                try:
                    ptr = t.untyped_storage().data_ptr()
                except (RuntimeError, NotImplementedError):
                    continue
                self._write_gen[ptr] = self._write_gen.get(ptr, 0) + 1

    def expect_version_bump(self, tensors: Iterable[Any]) -> None:
        """These tensors were just written by a single-tensor in-place/out op, whose version
        counter autograd bumps only after the dispatch mode returns: what was noted about them
        (statistics, producer) describes the next version. (If the bump does not come, the
        entries simply never match again: a re-measurement, never a stale value.)"""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            for memo, vi in ((self._measured, 0), (self._producers, 2)):
                e = memo.get(t)
                if e is not None:
                    try:
                        if e[vi] == t._version:
                            memo[t] = e[:vi] + (e[vi] + 1,) + e[vi + 1:]
                    except RuntimeError:
                        pass

    def expanded_values(self, src: Any, dst: Any, version: int | None = None) -> None:
        """``dst = src.expand(...)`` repeats every element of ``src`` the same number of times:
        its statistics follow from ``src``'s (norm and NaN/Inf counts scale), no pass needed.
        ``version``: the one ``dst`` will have (:func:`view_version`)."""
        if not self.reuse_stats or not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor) \
                or src.dtype != dst.dtype or src.device != dst.device:
            return
        hit = self._lookup(src)
        n_in, n_out = src.numel(), dst.numel()
        if hit is None or not isinstance(hit[0], list) or n_in == 0 or n_out % n_in:
            return
        f = n_out // n_in
        mx, mn, mean, norm, nan, inf = hit[0]
        self._remember(dst, ([mx, mn, mean, norm * math.sqrt(f), nan * f, inf * f], None, None, None), version)

    def same_values(self, src: Any, dst: Any, keeps_order: bool = True, version: int | None = None) -> None:
        """``dst`` holds exactly ``src``'s elements (a view, transpose or clone of it): give it
        ``src``'s measurement if it is known and current, instead of measuring it again. With
        ``keeps_order=False`` (transposes) only the statistics carry over: the row-major bytes,
        hence checksum and saved copy, differ. ``version``: the one ``dst`` will have
        (:func:`view_version`; None: its own)."""
        if not self.reuse_stats or not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor) \
                or src.dtype != dst.dtype or src.device != dst.device or src.numel() != dst.numel():
            return
        hit = self._lookup(src)
        if hit is None:
            return
        self._remember(dst, hit if keeps_order else (hit[0], None, None, None), version)

    def note_outputs(self, rid: int, outputs: list[tuple[str, Any]], overwrite: bool = True,
                     version: int | None = None) -> None:
        """Remember which record produced each output tensor (for the inputs' ``producer``);
        ``version``: the one the outputs will have (:func:`view_version`; None: their own)."""
        for i, (_, v) in enumerate(outputs):
            if isinstance(v, torch.Tensor):
                if not overwrite and v in self._producers:
                    continue
                try:
                    self._producers[v] = (rid, i, v._version if version is None else version)
                except (TypeError, RuntimeError):  # RuntimeError: an inference tensor (no version)
                    pass


def view_version(args: tuple) -> int | None:
    """The version counter a view op's outputs will have once the dispatcher returns: their base's
    (``args[0]``, the ``self`` of every aten view op). Inside a dispatch mode a view's counter is
    still its own, at 0: the ADInplaceOrView kernel, above the mode, shares the base's counter only
    after the mode returned. None when unknown (no tensor base, an inference tensor): the outputs'
    own counters are used, as for other ops. A wrong guess can only miss (a re-measurement), never
    reuse a stale value: writes also move the storage's write generation."""
    if args and isinstance(args[0], torch.Tensor):
        try:
            return args[0]._version
        except RuntimeError:  # inference tensors have no version counter
            return None
    return None
