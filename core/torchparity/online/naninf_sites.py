"""Creation sites, sinks and verdicts of :class:`~torchparity.online.naninf.NanInfTracker`:
which op created a NaN/Inf, whether it reached a sink (harmful) or was absorbed, and the step's
findings."""

from __future__ import annotations

from typing import Any

import torch

from ..capture.tool_state import _tool_state
from ..naninf_rule import is_sink
from ..capture.compiled import compiled_functions_note
from .naninf_findings import COMPILED_NOTE, SCALER_NOTE, NanInfFinding
from .naninf_rules import _CHUNK, _FINITE, _FLOAT, _INF, _NAN, _SENTINEL, _STRIDED, _OpInfo, _flat_tensors


class SiteJudge:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: sites, sinks, verdicts."""

    def _output_sink(self, output: Any) -> None:
        """The model's output is a sink: its NaN/Inf (and their sites) are harmful."""
        with self._lock:
            self._resolve()
            state = _tool_state
            state.busy = getattr(state, "busy", 0) + 1
            try:
                self._sunk = True
                for t in _flat_tensors(output):
                    if t.dtype in _FLOAT and t.layout == _STRIDED and t.numel():
                        f = self._entry(t)[3]
                        if type(f) is not int:  # a device screen: judged in _device_lineage
                            self._dev_out.append(id(f))
                            self._dev_keep.append(f)
                        elif f:
                            self._sink(f >> 2)
            finally:
                state.busy -= 1

    def _verdict(self, seq: int, row: tuple, out_fact: int, bad: bool, create: bool, mask: int, phase: str,
                 frame: Any) -> int:
        """An op whose output holds NaN/Inf: a creation site (finite inputs, or a NaN scalar
        argument) or a propagator of the sites in ``mask``. Returns the output's site mask.

        Sinks (where a NaN/Inf is harmful): every op of the backward (gradients) and of the
        optimizer (parameters, state), and forward ops outside any module (the loss, the user's
        code); the root module's output is checked on its exit (:meth:`_module_exit`)."""
        if create or not bad:
            mask |= 1 << self._site(seq, row, "NaN" if out_fact & 3 == _NAN else "Inf")
        if phase == "backward" or phase == "optimizer" or (frame is None and phase == "forward"):
            self._sink(mask)
        return mask

    def _site(self, seq: int, row: tuple, value: str) -> int:
        """Index of the creation site of ``row`` (one per op, module and phase in a step)."""
        key = (row[3], row[4], row[6])
        i = self._site_ix.get(key)
        if i is None:
            i = self._site_ix[key] = len(self._sites)
            self._sites.append((seq, row, value))
        return i

    def _sink(self, mask: int) -> None:
        """NaN/Inf of the sites in ``mask`` reached a sink (no site known: ``_lost``)."""
        self._sunk = True
        if mask:
            self._harm |= mask
        else:
            self._lost = True

    def _judge(self, info: _OpInfo, n: int, seq: int, ins: list[tuple], bad_scalar: int, outs: list[tuple],
               out_ts: list[torch.Tensor] = (), writes: bool = False) -> None:  # type: ignore[assignment]
        """Creation site or propagator? On the host at once when every screen is a host fact
        (with the lineage of its NaN/Inf, see :meth:`_verdict`), else queued for the device fold."""
        if self._chain:
            self._resolve()
        step = self.current_step
        device = False
        bad_in = bad_scalar == _INF
        bad_ext = False
        in_mask = 0
        for e in ins:
            f = e[3]
            if type(f) is int:
                if f:
                    in_mask |= f >> 2
                    if e[4] == step:
                        bad_in = True
                    else:
                        bad_ext = True
            else:
                device = True
        out_fact = _FINITE
        for e in outs:
            f = e[3]
            if type(f) is int:
                if f & 3 > out_fact:
                    out_fact = f & 3
            else:
                device = True
        if not device:
            if bad_ext and self._host_entered is None:
                self._host_entered = (seq, self._row(info, n))
            if out_fact:
                row = self._row(info, n)
                frame = self._tracker.current() if self._tracker is not None else None
                mask = self._verdict(seq, row, out_fact, bad_in or bad_ext, bad_scalar == _NAN, in_mask, row[6], frame)
                memo = self._memo
                for t in out_ts:
                    e = memo.get(t)
                    if e is not None and type(e[3]) is int and e[3]:
                        memo[t] = (e[0], e[1], e[2], (e[3] & 3) | (mask << 2), e[4])
                        if writes and mask:
                            self._wsites[e[1]] = self._wsites.get(e[1], 0) | mask
            return
        j = len(self._table)
        self._table.append((seq, self._row(info, n)))
        p = self._pending
        if bad_scalar == _NAN:
            p.force_ops.append(j)
        if bad_in:
            p.bad_in_ops.append(j)
        if bad_ext:
            p.bad_ext_ops.append(j)
        if out_fact:
            (p.nan_out_ops if out_fact == _NAN else p.bad_out_ops).append(j)
        in_ids = []
        for e in ins:
            f = e[3]
            if type(f) is not int:
                if e[4] == step:
                    p.in_op.append(j)
                    p.in_val.append(f)
                    in_ids.append(id(f))
                else:
                    p.ext_op.append(j)
                    p.ext_val.append(f)
                    if id(f) in self._lin_alias:  # may hold values copied in place: their sites
                        in_ids.append(id(f))
        out_ids = []
        for e in outs:
            f = e[3]
            if type(f) is not int:
                p.out_op.append(j)
                p.out_val.append(f)
                out_ids.append(id(f))
                if self._state_device is None:
                    self._state_device = f.device
                if writes and e[1] >= 0:  # written in place (``h[0, 3] = log(-1)`` is a fill_):
                    self._wrote_screen(e[1], f)  # its readers read this op's sites (host: _wsites)
        phase = self._table[j][1][6]
        sink = is_sink(phase, self._tracker is None or self._tracker.current() is None)
        # lineage, walked on the host only in a step where the device found a creation site
        self._lin.append((in_ids, in_mask, out_ids, sink))
        if len(p) >= _CHUNK:
            self._fold()

    def _read(self) -> NanInfFinding | None:
        """The current step's top finding so far (folds; one host sync)."""
        found = self._collect()[0]
        return found[0] if found else None

    def _collect(self) -> tuple[list[NanInfFinding], list[NanInfFinding]]:
        """Fold, bring the state to the host (the one sync of a step; a second one only when the
        device found creation sites), and sort the creation sites: (findings, absorbed).

        Findings: the sites whose NaN/Inf reached a sink, in op order; every site when no sink
        ran (plain functions, no module, no backward) or when a sink held a NaN/Inf of no known
        site. Absorbed: the other sites (their NaN/Inf was selected, clamped, cast or softmaxed
        away). Without sites, the first read of a non-finite tensor nobody created is "entered".
        """
        with self._lock:
            self._resolve()
            self._fold()
            entered = self._host_entered
            if self._state is not None:
                c_key, e_key = (int(x) for x in self._state.tolist())
                self._keep.clear()
                # device-judged sites, or a non-finite value no tracked op made (an additive -inf
                # mask passed in, NaN data): walk the lineage (did it reach a sink?)
                if (c_key < _SENTINEL or (e_key < _SENTINEL and self.report_entered)) and self._dev_keys:
                    self._device_lineage()
                self._dev_keys = []  # read: a later check() or step end does not read them again
                if e_key < _SENTINEL:
                    seq, row = self._table[e_key]
                    if entered is None or seq < entered[0]:
                        entered = (seq, row)
            sites = list(self._sites)
            harm = self._harm
            # (a read of an in-place history too long to remember looks "entered": its NaN/Inf
            # may be any site's, so every site is harmful then, not the read)
            if not self._sunk or (self._lost and (entered is None or self._lineage_cut)):
                harm = (1 << len(sites)) - 1
            found = sorted((x for i, x in enumerate(sites) if harm >> i & 1), key=lambda x: x[0])
            absorbed = [self._finding("absorbed", *x) for i, x in enumerate(sites) if not harm >> i & 1]
            if self._scaler_seen:
                # a GradScaler checked the gradients (fp16 AMP): an overflow of the scaled backward
                # makes it skip the optimizer step and lower the scale, by design; a NaN/Inf made in
                # the forward (the loss) is still a finding (found by a new-user check, session 18)
                absorbed += [self._finding("absorbed", *x, note=SCALER_NOTE) for x in found if x[1][6] == "backward"]
                found = [x for x in found if x[1][6] != "backward"]
                absorbed.sort(key=lambda f: f.seq)
            findings = [self._finding("created", *x) for x in found]
            # a non-finite value no tracked op made is a finding once it reaches a sink (NaN data:
            # the loss, a gradient) or when no sink ran; absorbed (an additive -inf attention mask
            # passed in as an input, softmaxed away) it is not (found by a new-user check, session 16)
            if not findings and entered is not None and self.report_entered and (self._lost or not self._sunk):
                # made where the tracker cannot see, perhaps: inside a compiled function's kernels
                note = COMPILED_NOTE if compiled_functions_note() is not None else ""
                findings = [self._finding("entered", entered[0], entered[1], "NaN/Inf", note=note)]
            return findings, absorbed

    def _device_lineage(self) -> None:
        """Sites found by the device fold, and which of them reached a sink: one more host read
        (every op's culprit key and every output screen's "non-finite" flag), then the host walks
        the ops in order, passing each output the sites its inputs carried (screens are matched
        by identity; a producer always comes before its readers). Any inconsistency makes every
        device site harmful (never hides a finding)."""
        keys = torch.cat(self._dev_keys).tolist()
        flags = torch.cat(self._dev_outflags).tolist() if self._dev_outflags else []
        culprits = {k // 2: ("Inf" if k % 2 else "NaN") for k in keys if k < _SENTINEL}
        lin = self._lin
        if len(lin) != len(self._table) or sum(len(x[2]) for x in lin) != len(flags):
            for j, value in culprits.items():
                seq, row = self._table[j]
                self._harm |= 1 << self._site(seq, row, value)
            self._sunk = True
            self._lost = True  # never hide: whatever entered may have reached a sink
            return
        masks: dict[int, int] = {}
        # screens that may hold NaN/Inf of sites the walk cannot name (a storage written in place
        # more often than remembered, _MAX_WSCREENS): reaching a sink non-finite, every site is harmful
        unknown: set[int] = set()
        nonfinite: set[int] = set()  # output screens the device found non-finite
        k = 0
        alias = self._lin_alias

        def sites_of(i: int) -> tuple[int, bool]:
            """(sites screen ``i`` may carry, may it carry sites no one can name); a screen of a
            storage written in place carries what was copied into it"""
            m, u = masks.get(i, 0), i in unknown
            a = alias.get(i)
            if a is not None:
                for w in a[1]:
                    m |= masks.get(id(w), 0)
                u = u or a[2]
            return m, u

        for j, (in_ids, m, out_ids, sink) in enumerate(lin):
            u = False
            for i in in_ids:
                mi, ui = sites_of(i)
                m |= mi
                u = u or ui
            value = culprits.get(j)
            if value is not None:
                seq, row = self._table[j]
                m |= 1 << self._site(seq, row, value)
            bad = False
            for o in out_ids:
                b = flags[k]
                k += 1
                masks[o] = m if b else 0
                if b:
                    nonfinite.add(o)
                if u and b:
                    unknown.add(o)
                bad = bad or b
            if sink and bad:
                if u:  # NaN/Inf the walk lost track of reached a sink: every site is harmful
                    self._sink(0)
                    self._lineage_cut = True
                self._sink(m)
        for i in self._dev_out:
            m, _ = sites_of(i)
            if m or i in nonfinite:  # (no site: a non-finite output of what entered)
                self._sink(m)
            if i in unknown:
                self._sink(0)
                self._lineage_cut = True

    def _finding(self, kind: str, seq: int, row: tuple, value: str, note: str = "") -> NanInfFinding:
        prefix, base, call, op, module, module_class, phase = row
        return NanInfFinding(kind=kind, name=f"{prefix}.{base}.{call}.{phase}", op=op, module=module, module_class=module_class,
                             phase=phase, step=self.current_step, seq=seq, value=value, note=note)
