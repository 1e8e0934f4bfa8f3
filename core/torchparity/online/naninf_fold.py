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


def _stacked(vals: list[torch.Tensor], dev: torch.device) -> torch.Tensor | None:
    """``vals`` (0-d screens) as one 1-d tensor on ``dev`` (None when there are none).

    Most screens are 0-d slots of one arena (:meth:`~.naninf_screens.ScreenMemo._device_screen`):
    stacking those cost ~0.8 us each on an H200 host, where 0-d screens allocated one by one cost
    ~8 us each (bench/results/session16/)."""
    if not vals:
        return None
    return torch.stack([v if v.device == dev else v.to(dev, non_blocking=True) for v in vals])


class DeviceFold:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: the device-side fold."""

    def _fold(self) -> None:
        """Reduce the pending screens into the device state (no host sync)."""
        if self._queued_n:  # the queued screens' reduction runs first
            self._flush_screens()
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

            def flags(ops: Any, screens: torch.Tensor | None, test: Any) -> torch.Tensor:
                """Per op: how many of its ``screens`` pass ``test`` (``ops``: the op of each
                screen, a list or its index tensor already on the device)."""
                acc = torch.zeros(n_ops, dtype=torch.int32, device=dev)
                if screens is not None:
                    acc.index_add_(0, ops if isinstance(ops, torch.Tensor) else idx(ops, start),
                                   test(screens).to(torch.int32))
                return acc

            def nonfinite(x: torch.Tensor) -> torch.Tensor:
                return ~torch.isfinite(x)

            in_bad = flags(p.in_op, _stacked(p.in_val, dev), nonfinite)
            ext_bad = flags(p.ext_op, _stacked(p.ext_val, dev), nonfinite)
            outs = _stacked(p.out_val, dev)  # stacked (and their ops sent) once for the three uses
            out_ops = idx(p.out_op, start) if outs is not None else None
            out_bad = flags(out_ops, outs, nonfinite)
            if outs is not None:  # per output screen, for the lineage of a step with a creation site
                self._dev_outflags.append(nonfinite(outs))
            out_nan = flags(out_ops, outs, torch.isnan)
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
