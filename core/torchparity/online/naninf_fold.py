"""The device side of :class:`~torchparity.online.naninf.NanInfTracker`: screens queued per op
and folded on the device into a few numbers, read once per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture.tool_state import tool_work
from .naninf_rules import _SENTINEL

@dataclass
class _Pending:
    """Device-side screens waiting for the next fold; ``*_op`` are indices into the device table."""

    in_op: list[int] = field(default_factory=list)  # op of each tracked-input screen
    in_val: list[torch.Tensor] = field(default_factory=list)
    ext_op: list[int] = field(default_factory=list)  # same, for inputs no tracked op produced
    ext_val: list[torch.Tensor] = field(default_factory=list)
    out_op: list[int] = field(default_factory=list)
    out_val: list[torch.Tensor] = field(default_factory=list)
    bad_in_ops: list[int] = field(default_factory=list)  # non-finite scalar argument or CPU input
    bad_ext_ops: list[int] = field(default_factory=list)  # non-finite external CPU input
    bad_out_ops: list[int] = field(default_factory=list)  # non-finite CPU output (Inf)
    nan_out_ops: list[int] = field(default_factory=list)  # NaN CPU output
    force_ops: list[int] = field(default_factory=list)  # a NaN scalar argument: a creation whatever the inputs

    def __len__(self) -> int:
        return len(self.in_val) + len(self.ext_val) + len(self.out_val)


def _gather(vals: list[torch.Tensor], dev: torch.device, idx: Any) -> list[tuple[torch.Tensor, list[int]]]:
    """``vals`` (0-d screens) as a few 1-d tensors on ``dev``: (screens, their positions in
    ``vals``). Screens in an arena slot (:meth:`~.naninf_screens.ScreenMemo._device_screen`) are
    read with one ``index_select`` per arena; the others (float64 screens, another device's)
    are stacked."""
    arenas: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
    loose: list[torch.Tensor] = []
    loose_pos: list[int] = []
    for i, v in enumerate(vals):
        b = v._base
        if b is not None and b.device == dev and b.dtype is torch.float32 and b.dim() == 1:
            a = arenas.get(id(b))
            if a is None:
                a = arenas[id(b)] = (b, [], [])
            a[1].append(v.storage_offset())
            a[2].append(i)
        else:
            loose.append(v if v.device == dev else v.to(dev, non_blocking=True))
            loose_pos.append(i)
    out = [(b.index_select(0, idx(slots)), pos) for b, slots, pos in arenas.values()]
    if loose:
        out.append((torch.stack(loose), loose_pos))
    return out


class DeviceFold:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: the device-side fold."""

    def _fold(self) -> None:
        """Reduce the pending screens into the device state (no host sync)."""
        p = self._pending
        self._pending = _Pending()
        start, end = self._folded, len(self._table)
        self._folded = end
        n_ops = end - start
        if n_ops == 0:
            return
        dev = self._state_device
        if dev is None:
            dev = next((v.device for v in p.in_val + p.ext_val if v.device.type != "cpu"), torch.device("cpu"))
            self._state_device = dev
        with tool_work():
            def idx(xs: list[int], shift: int = 0) -> torch.Tensor:
                t = torch.tensor(xs, dtype=torch.long)
                if shift:
                    t -= shift
                if dev.type == "cpu":
                    return t
                try:  # pinned, so that the copy is asynchronous (no host sync)
                    t = t.pin_memory()
                except RuntimeError:
                    pass
                self._keep.append(t)
                return t.to(dev, non_blocking=True)

            def flags(ops: list[int], groups: list[tuple[torch.Tensor, list[int]]], test: Any) -> torch.Tensor:
                """Per op: how many of its screens (gathered in ``groups``) pass ``test``."""
                acc = torch.zeros(n_ops, dtype=torch.int32, device=dev)
                for vals, pos in groups:
                    at = ops if len(pos) == len(ops) else [ops[i] for i in pos]
                    acc.index_add_(0, idx(at, start), test(vals).to(torch.int32))
                return acc

            def nonfinite(x: torch.Tensor) -> torch.Tensor:
                return ~torch.isfinite(x)

            in_bad = flags(p.in_op, _gather(p.in_val, dev, idx), nonfinite)
            ext_bad = flags(p.ext_op, _gather(p.ext_val, dev, idx), nonfinite)
            outs = _gather(p.out_val, dev, idx)
            out_bad = flags(p.out_op, outs, nonfinite)
            if p.out_val:  # per output screen, in order, for the lineage of a step with a creation site
                if len(outs) == 1 and len(outs[0][1]) == len(p.out_val):
                    self._dev_outflags.append(nonfinite(outs[0][0]))
                else:
                    ordered = torch.empty(len(p.out_val), dtype=torch.bool, device=dev)
                    for vals, pos in outs:
                        ordered.index_copy_(0, idx(pos), nonfinite(vals))
                    self._dev_outflags.append(ordered)
            out_nan = flags(p.out_op, outs, torch.isnan)
            for ops, acc in ((p.bad_in_ops, in_bad), (p.bad_ext_ops, ext_bad), (p.bad_out_ops, out_bad),
                             (p.nan_out_ops, out_bad), (p.nan_out_ops, out_nan)):
                if ops:
                    acc.index_fill_(0, idx(ops, start), 1)
            rows = torch.arange(start, end, dtype=torch.long, device=dev)
            sentinel = torch.full((), _SENTINEL, dtype=torch.long, device=dev)
            culprit = (out_bad > 0) & (in_bad == 0) & (ext_bad == 0)
            if p.force_ops:  # a NaN scalar argument created NaN whatever the inputs held
                forced = torch.zeros(n_ops, dtype=torch.bool, device=dev)
                forced.index_fill_(0, idx(p.force_ops, start), True)
                culprit = culprit | (forced & (out_bad > 0))
            # key = 2*row + (0 if NaN else 1): the smallest key is the first culprit, its low bit the kind
            keys = torch.where(culprit, rows * 2 + (out_nan == 0).long(), sentinel)
            self._dev_keys.append(keys)  # every culprit, read only when there is one
            c_key = keys.amin()
            e_key = torch.where(ext_bad > 0, rows, sentinel).amin()
            new = torch.stack([c_key, e_key])
            self._state = new if self._state is None else torch.minimum(self._state, new)
