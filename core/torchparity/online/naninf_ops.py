"""The per-op checks of :class:`~torchparity.online.naninf.NanInfTracker`: an op that hands its
input's values on (a view, a copy, an exact scaling) shares its input's screen; any other op that
may create a NaN/Inf has its inputs and outputs screened and is judged (on the host at once, in a
deferred chain, or queued for the device fold).

``run(*args, **kwargs)`` is the op stream's continuation (the rest of the consumer chain and the
kernel, see :class:`~torchparity.capture.op_stream.OpConsumer`): what it returns is what the
model gets, so an emulated device's fault is seen here.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..capture.measure_reuse import view_version
from ..capture.tool_state import _tool_state
from .naninf_rules import (_FINITE, _FLOAT, _INF, _NAN, _PENDING, _EXTERNAL, _STRIDED, _WIDTH, _OpInfo, _accumulates,
                           _inherits_into, _scalars_in_range, _tensors)


#: screens remembered per storage written in place within a step (device path; see _aliasing)
_MAX_WSCREENS = 64


class OpChecks:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: the checks of one op."""

    def _wrote_screen(self, ptr: int, f: torch.Tensor) -> None:
        """The device path: values whose screen is ``f`` were written into storage ``ptr`` in place
        (a copy, ``fill_`` with a tensor value, an in-place op): whoever reads that storage next
        reads their creation sites (the lineage walk, SiteJudge._device_lineage)."""
        ws = self._wscreens.setdefault(ptr, [])
        if len(ws) < _MAX_WSCREENS:
            ws.append(f)
        else:  # a long in-place history (a KV cache): lineage incomplete
            self._wtrunc.add(ptr)

    def _aliasing(self, run: Any, args: tuple, kwargs: dict, src: torch.Tensor, info: _OpInfo, n: int) -> Any:
        """A view, copy or exact scaling: its outputs share the screen of ``src`` (no table entry;
        it cannot be a culprit). Narrowing casts (float32 -> float16 can overflow) are checked."""
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            hit = self._entry(src)
        finally:
            state.busy -= 1
        out = run(*args, **kwargs)
        state.busy += 1
        # a view's outputs share their base's version counter once the dispatcher returns
        vv = view_version(args) if info.view else None
        try:
            written = self._note_writes(args, kwargs, info.writes) if info.writes else ()
            wrote = {id(w): (b, ptr) for w, b, ptr in written} if written else None
            for t in (out,) if isinstance(out, torch.Tensor) else _tensors(out):
                if t.dtype not in _FLOAT or t.layout != _STRIDED:
                    continue
                bump, ptr = wrote.get(id(t), (0, hit[1] if info.view else None)) if wrote else \
                    (0, hit[1] if info.view else None)
                if t.dtype == src.dtype or _WIDTH[t.dtype] > _WIDTH[src.dtype]:
                    if hit[3] is _PENDING and not written and t.is_cpu:
                        self._remember(t, hit[4], _PENDING, 0, ptr, k=hit[5], version=vv)
                        if id(src) in self._tail and t.numel() == src.numel():
                            self._tail.add(id(t))
                    elif hit[3] is _PENDING:  # a write, or a copy to another device: judge first
                        self._resolve()
                        self._remember(t, hit[4], None, bump, ptr, version=vv)
                    elif t.is_cpu == src.is_cpu or type(hit[3]) is int:
                        self._remember(t, hit[4], hit[3], bump, ptr, version=vv)
                    else:  # a device screen for a CPU copy (or back): measured where it lives
                        self._remember(t, hit[4], None, bump, ptr, version=vv)
                    if written and ptr is not None:
                        # NaN/Inf of known creation sites copied into a tensor in place (``h[0, 3] =
                        # log(-1)``): whoever reads that storage next reads those sites' values,
                        # not a NaN/Inf that "entered" from nowhere (see ScreenMemo._entry)
                        f = hit[3] if hit[3] is not _PENDING else self._entry(src)[3]  # resolved above
                        if type(f) is int:
                            if f >> 2:
                                self._wsites[ptr] = self._wsites.get(ptr, 0) | (f >> 2)
                        elif isinstance(f, torch.Tensor):  # the device path: the fold will tell
                            self._wrote_screen(ptr, f)
                elif t.numel():  # a narrowing cast: may overflow, so it is measured
                    if hit[3] is _PENDING:
                        self._resolve()
                        hit = self._entry(src)
                    seq = self._seq
                    self._seq = seq + 1
                    self._judge(info, n, seq, [hit], 0,
                                [self._remember(t, self.current_step, None, bump, ptr, version=vv)],
                                [t], bool(written))
        finally:
            state.busy -= 1
        return out

    def _checked(self, run: Any, args: tuple, kwargs: dict, info: _OpInfo, n: int, phase: str = "forward",
                 extends: bool = False) -> Any:
        """An op that may create a NaN/Inf: screen its inputs (before it runs: in-place ops
        overwrite them) and outputs, and judge it."""
        seq = self._seq
        self._seq = seq + 1
        ins: list[tuple] = []
        in_ts: list[torch.Tensor] = []  # the tensors of ``ins``
        widest = -1  # widest float input (inheritance must not narrow)
        bad_scalar = 0  # _INF: an Inf scalar argument (asked for); _NAN: a NaN one (creates NaN)
        opaque = False  # a sparse/quantised float input: not screened, so nothing is inherited
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            first, out_only = info.first, info.out_only
            cands: list[torch.Tensor] = []  # tensor inputs (not out= destinations), lists flattened
            for i, a in enumerate(args):
                if i < first:
                    continue
                if isinstance(a, torch.Tensor):
                    if i not in out_only:
                        cands.append(a)
                elif isinstance(a, (list, tuple)):
                    cands.extend(x for x in a if isinstance(x, torch.Tensor))
                elif isinstance(a, float) and not math.isfinite(a):
                    bad_scalar = max(bad_scalar, _NAN if a != a else _INF)
            if kwargs:
                for k, a in kwargs.items():
                    if isinstance(a, torch.Tensor):
                        if k not in out_only:
                            cands.append(a)
                    elif isinstance(a, float) and not math.isfinite(a):
                        bad_scalar = max(bad_scalar, _NAN if a != a else _INF)
            for a in cands:
                if a.dtype in _FLOAT:
                    if a.layout != _STRIDED:
                        opaque = True
                    elif a.numel():
                        e = self._entry(a)
                        f = e[3]
                        if type(f) is int and f and f < 4 and e[4] == _EXTERNAL and a.numel() == 1 \
                                and not a.requires_grad:
                            # a constant (``x[i] = nan`` lifts a 0-d tensor): a scalar argument
                            bad_scalar = max(bad_scalar, f)
                            continue
                        ins.append(e)
                        in_ts.append(a)
                        if _WIDTH[a.dtype] > widest:
                            widest = _WIDTH[a.dtype]
        finally:
            state.busy -= 1
        out = run(*args, **kwargs)
        state.busy += 1
        try:
            written = self._note_writes(args, kwargs, info.writes) if info.writes else ()
            outs = [out] if isinstance(out, torch.Tensor) else _tensors(out)
            # by identity, in one pass (a foreach op of the optimizer writes ~150 tensors: pairwise
            # tests cost ~40k comparisons per op)
            wrote = {id(w): (b, ptr) for w, b, ptr in written} if written else None
            if wrote:
                have = {id(t) for t in outs}
                for w, _, _ in written:
                    if id(w) not in have:
                        have.add(id(w))
                        outs.append(w)
            if self._chain:
                fl = [t for t in outs if t.dtype in _FLOAT and t.layout == _STRIDED]
                if extends and len(fl) == 1 and fl[0].is_cpu and fl[0].numel() \
                        and all(e[3] is _PENDING or type(e[3]) is int for e in ins):
                    self._defer(fl[0], info, n, seq, phase, ins, bad_scalar)  # the chain grows
                    return out
                self._resolve()
                ins = [self._entry(a) if len(e) == 6 else e for e, a in zip(ins, in_ts)]
            elif self._inherit and not info.inherits and not info.writes and len(outs) == 1 and outs[0].is_cpu \
                    and outs[0].dtype in _FLOAT and outs[0].layout == _STRIDED and outs[0].numel() \
                    and all(type(e[3]) is int for e in ins):
                self._defer(outs[0], info, n, seq, phase, ins, bad_scalar)  # a chain starts
                return out
            # CPU, trusted kernels: an op that cannot create a NaN/Inf, with finite inputs and
            # in-range scalars, has finite outputs: nothing to measure
            known = info.inherits and self._inherit and not bad_scalar and not opaque \
                and all(e[3] is _FINITE for e in ins) and _inherits_into(outs, widest) \
                and _scalars_in_range(args, kwargs, outs) and not _accumulates(info.base, args, kwargs)
            producer = self.current_step
            res = []
            res_ts = []
            for t in outs:
                if t.dtype in _FLOAT and t.layout == _STRIDED and t.numel():
                    bump, ptr = wrote.get(id(t), (0, None)) if wrote else (0, None)
                    res.append(self._remember(t, producer, _FINITE if known else None, bump, ptr))
                    res_ts.append(t)
            if not known:
                self._judge(info, n, seq, ins, bad_scalar, res, res_ts, bool(written))
        finally:
            state.busy -= 1
        return out
