"""Batched statistics on the value's own device: one kernel per value, a constant number per flush.

:class:`StatBatcher` measures values as an accelerator wants it: at measure time each value is
copied, cast on the fly, into its slice of a preallocated per-device *staging* buffer
(``staging[off:off+n].view(shape).copy_(value)``: ONE kernel whatever the value's dtype, strides
or expansion, and the copy is immune to any later in-place write to the value). Each value starts
on a row boundary of the buffer seen as a ``[rows, ROW]`` matrix (the rest of its last row stays
zero). At :meth:`flush` the matrix is reduced ROW-WISE (max / min / sum / sum of squares / NaN and
Inf counts: ordinary reductions over every row at once, as parallel as the device allows), the last
row of each value is corrected for its zero padding (max/min), and the row results are combined per
value (``torch.segment_reduce`` over a few rows each): a constant number of kernels; the rows
``[max, min, mean, norm, nan_count, inf_count]`` are written into a device result buffer, and they
reach the host with ONE device-to-host copy per flush and device group (``non_blocking`` into
pinned memory plus an event on CUDA, so the training thread never waits; the writer thread waits
on the event before it reads). No ``.item()``, ``.cpu()`` or ``.tolist()`` per value.

Semantics are those of :func:`~torchparity.capture.stats.host_stats`: max/min propagate NaN, the
norm of a value holding NaN is NaN and of one holding Inf (no NaN) is inf, the counts are exact.
Values are staged in their own floating dtype (see :func:`_staging_dtype`); sums and squares are
taken of each row divided by a power of two near its largest magnitude (an exact scaling), then
scaled back and summed in float64 where the device has it, so squares of huge values (1e20 in
float32, bfloat16 near its max, finfo.min masks) neither overflow nor lose anything but
accumulation order, without a float64 copy of the staging buffer.

Why rows: ``torch.segment_reduce`` straight over the values gives each segment ONE thread block
on CUDA (CUB's segmented reduce), so a flush of a few large activations used a few of the GPU's
132 multiprocessors: on an H200 a ~1 B-parameter Llama step took 2.6 s at module level and 11 s at
aten level against 0.07 s without the tool (bench/results/session11/).

On CUDA, a float32/bfloat16/float16 value that lies densely in memory skips the staging buffer:
one Triton kernel reads it where it lies and writes partial rows that the flush combines
(:mod:`.stat_triton`); the rest of this module is the path of every other value and device.

A value larger than the byte budget is measured alone (:func:`~.stats.stats_tensor`); its row
joins the same transfer. ``torch.segment_reduce`` exists from torch 2.1 (CPU and CUDA, NaN
propagating in max/min, checked on 2.1.2 and 2.13); on a device where it fails, scatter/index_add
reductions do the same work with the same constant number of kernels.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from . import stat_triton
from .segments import Segments, to_device
from .stats import safe_aminmax, pow2_scale, stats_tensor

_log = logging.getLogger("torchparity")
DEFAULT_BUDGET_BYTES = 64 << 20  # staging bytes per (device, staging dtype) before a flush is forced
CUDA_BUDGET_BYTES = 256 << 20  # the same on CUDA (at most 1 % of the device's memory)
ROW = 1024  # elements per row of the staging matrix (a value takes whole rows)
_FIRST_CAPACITY = 1 << 16  # elements allocated at first use; doubled up to the budget
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FLOAT64_DEVICES = {"cpu", "cuda"}  # result rows in float64 (a handful of values per row)


class _Chunk:
    """Rows of one flush of one group, on the host once the flush's transfer is done."""

    __slots__ = ("host", "event", "n_staged", "_rows")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.event: Any = None
        self.n_staged = 0
        self._rows: list[list[float]] | None = None

    def rows(self) -> list[list[float]]:
        """The rows as Python floats (waits for the transfer; called by the writer thread)."""
        if self._rows is None:
            if self.event is not None:
                self.event.synchronize()
            self._rows = [] if self.host is None else self.host.tolist()
        return self._rows


class RowRef:
    """Where one value's statistics will be: a row of a (possibly not yet flushed) chunk.
    Staged values have rows ``0..``; values measured alone ``-1, -2, ..`` (after the staged ones)."""

    __slots__ = ("chunk", "row")

    def __init__(self, chunk: _Chunk, row: int) -> None:
        self.chunk = chunk
        self.row = row

    def values(self) -> list[float]:
        rows = self.chunk.rows()
        r = self.row
        return rows[r if r >= 0 else self.chunk.n_staged - r - 1]


class _Group:
    """Staging state of one (device, staging dtype)."""

    __slots__ = ("device", "dtype", "width", "limit", "staging", "used", "lengths", "rows", "singles", "chunk",
                 "result", "partials")

    def __init__(self, device: torch.device, dtype: torch.dtype | None) -> None:
        self.device = device
        self.dtype = dtype  # None: the Triton group of the device (values measured where they lie)
        self.partials = None if dtype is not None else stat_triton.Partials(device)
        self.width = 1  # elements per staging row
        self.limit = 0  # staging elements before a flush (a multiple of the width)
        self.staging: torch.Tensor | None = None  # zero wherever no value is staged
        self.used = 0  # elements, a multiple of the row width
        self.lengths: list[int] = []  # elements of each staged value
        self.rows: list[int] = []  # rows of each staged value
        self.singles: list[torch.Tensor] = []
        self.chunk = _Chunk()
        self.result: torch.Tensor | None = None


_NATIVE = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # staged as they are
#: integers wider than float32's 24-bit mantissa: staged in float64 where the device has it
_WIDE_INTS = tuple(getattr(torch, n) for n in ("int32", "int64", "uint32", "uint64") if hasattr(torch, n))


def _staging_dtype(t: torch.Tensor) -> torch.dtype:
    """Floating values are staged in their own dtype (a bfloat16 value costs 2 bytes a copy and a
    read, not 4); 32- and 64-bit integers in float64 (exact up to 2**53; float32 where the device
    has no float64); the narrower integers, bool and the float8 types in float32 (exact)."""
    if t.dtype in _NATIVE:
        return t.dtype
    if t.dtype in _WIDE_INTS and t.device.type in _FLOAT64_DEVICES:
        return torch.float64
    return torch.float32


def _budget(device: torch.device) -> int:
    """Default staging bytes per group: larger on CUDA (fewer flushes: each costs some 40 kernel
    launches), never over 1 % of the device's memory."""
    if device.type == "cuda":
        try:
            return min(CUDA_BUDGET_BYTES, torch.cuda.get_device_properties(device).total_memory // 100)
        except (RuntimeError, AssertionError, AttributeError):  # pragma: no cover - no such device
            return DEFAULT_BUDGET_BYTES
    return DEFAULT_BUDGET_BYTES


def _alloc(n: int, dtype: torch.dtype, device: torch.device, zero: bool = False) -> torch.Tensor:
    with torch.inference_mode(False):  # a buffer made in inference mode could not be written outside it
        return torch.zeros(n, dtype=dtype, device=device) if zero else torch.empty(n, dtype=dtype, device=device)


def _row_width(limit: int) -> int:
    """Elements per staging row: :data:`ROW`, or a smaller power of two for a tiny budget."""
    w = ROW
    while w > 1 and w * 64 > limit:
        w //= 2
    return w


class StatBatcher:
    """Queue values for statistics; :meth:`flush` computes all their rows at once.

    ``add(value)`` returns a :class:`RowRef` (or None for a value without statistics: empty,
    complex, meta, sparse), ``flush()`` runs the reductions and starts the transfers. A group whose
    staging buffer would pass the byte budget is flushed by ``add`` itself; the caller flushes when
    it hands records on (each batch, the end of a step and of the dump)."""

    def __init__(self, budget_bytes: int | None = None, force_fallback: bool = False,
                 triton: bool | None = None) -> None:
        if budget_bytes is not None and (not isinstance(budget_bytes, int) or budget_bytes <= 0):
            raise ValueError(f"budget_bytes must be a positive int (got {budget_bytes!r})")
        self.budget_bytes = budget_bytes  # None: :func:`_budget` of each device
        self.force_fallback = force_fallback  # use the scatter reductions (tests)
        # the one-pass Triton kernel for the values it takes: None = where usable (CUDA with
        # Triton; the CPU only under TRITON_INTERPRET=1), False = never (the staging path only)
        self.triton = triton
        self._triton_devices: dict[torch.device, bool] = {}
        self._arange: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._groups: dict[tuple[torch.device, torch.dtype | None], _Group] = {}  # None: the Triton group
        self.queued = 0  # values added since the last flush
        self.added = 0  # values added in all (for the counting bench)
        self.flushes = 0  # flushes that moved rows to the host (for the counting bench)

    @property
    def kernel_launches(self) -> int:
        """Triton kernels launched so far: not torch ops, so a dispatch mode does not see them
        (for the counting bench)."""
        return sum(g.partials.launches for g in self._groups.values() if g.partials is not None)

    # ---- measure time --------------------------------------------------------------------
    def add(self, v: torch.Tensor) -> RowRef | None:
        n = v.numel()
        if n == 0 or v.dtype.is_complex or v.layout != torch.strided or v.device.type == "meta":
            return None
        if self.triton is not False and type(v) in _PLAIN and stat_triton.eligible(v) and self._triton_on(v.device):
            ref = self._add_triton(v, n)
            if ref is not None:
                return ref
        sd = _staging_dtype(v)
        key = (v.device, sd)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(v.device, sd)
            limit = (self.budget_bytes or _budget(v.device)) // torch.empty((), dtype=sd).element_size()
            g.width = _row_width(limit)
            g.limit = limit // g.width * g.width
        self.queued += 1
        self.added += 1
        w, limit = g.width, g.limit
        rows = -(-n // w)
        span = rows * w
        if span > limit or type(v) not in _PLAIN:  # too large to stage, or a tensor subclass
            return self._single(g, v)
        if g.used + span > limit:  # staging full: reduce what is there, then stage this one
            self._flush_group(g)
        st = g.staging
        if st is None or g.used + span > st.numel():
            cap = st.numel() if st is not None else min(_FIRST_CAPACITY // w * w or w, limit)
            while cap < g.used + span:
                cap *= 2
            new = _alloc(min(cap, limit), sd, v.device, zero=True)
            if st is not None and g.used:
                new[:g.used].copy_(st[:g.used])
            st = g.staging = new
        off = g.used
        try:
            st[off:off + n].view(v.shape).copy_(v.detach())
        except (RuntimeError, TypeError, NotImplementedError):
            return self._single(g, v)
        g.used = off + span
        g.lengths.append(n)
        g.rows.append(rows)
        return RowRef(g.chunk, len(g.lengths) - 1)

    def add_many(self, values: list[torch.Tensor]) -> list[RowRef | None]:
        """:meth:`add` of each value, with the values the Triton kernel takes measured by one
        launch per device and dtype (a compiled graph's captured values, see
        :mod:`~torchparity.compile.stats_op`) instead of one launch and some 15 us of host time
        each. The returned refs are in ``values``' order."""
        refs: list[RowRef | None] = [None] * len(values)
        # one launch per device, dtype and alignment: values whose address and size are multiples of
        # 16 are read with 16-byte loads (stat_triton._stats_partials_multi's ALIGNED)
        batches: dict[tuple[torch.device, torch.dtype, bool], list[int]] = {}
        for i, v in enumerate(values):
            n = v.numel()
            if self.triton is not False and type(v) in _PLAIN and v.layout == torch.strided and n \
                    and stat_triton.eligible(v) and self._triton_on(v.device):
                batches.setdefault((v.device, v.dtype, v.data_ptr() % 16 == 0 and n % 16 == 0), []).append(i)
            else:
                refs[i] = self.add(v)
        for (device, _, aligned), idx in batches.items():
            # (the kernel failed on this device for an earlier batch: the staging path for the rest)
            done = self._add_triton_many(device, [values[i] for i in idx], idx, refs, aligned) \
                if self._triton_on(device) else 0
            for i in idx[done:]:  # the kernel failed: the staging path (add's, from now on)
                refs[i] = self.add(values[i])
        return refs

    def _add_triton_many(self, device: torch.device, vals: list[torch.Tensor], idx: list[int],
                         refs: list[RowRef | None], aligned: bool = False) -> int:
        """Launch ``vals`` (one dtype) in as few launches as the partial-row limit allows; their
        refs go to ``refs[idx[j]]``. Returns how many were queued (fewer when a launch failed)."""
        key = (device, None)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(device, None)
        p = g.partials
        assert p is not None
        start = 0
        while start < len(vals):
            room = stat_triton.LIMIT_ROWS - p.used
            end, total = start, 0
            while end < len(vals):
                c = p.chunks(vals[end].numel())[1]
                if total + c > room and end > start:
                    break
                total += c
                end += 1
            if total > room and p.used:  # not even the first fits: flush, then again
                self._flush_group(g)
                continue
            try:
                p.add_many(vals[start:end], aligned)
            except Exception as exc:  # noqa: BLE001 - any failure of Triton's compile or launch
                self._triton_devices[device] = False
                _log.warning("torchparity: statistics on %s take the staging path: the Triton kernel failed (%s: %s)",
                             device, type(exc).__name__, " ".join(str(exc).split())[:200])
                return start
            for j in range(start, end):
                g.lengths.append(vals[j].numel())
                refs[idx[j]] = RowRef(g.chunk, len(g.lengths) - 1)
            self.queued += end - start
            self.added += end - start
            start = end
        return start

    def _triton_on(self, device: torch.device) -> bool:
        on = self._triton_devices.get(device)
        if on is None:
            on = self._triton_devices[device] = stat_triton.usable(device)
        return on

    def _add_triton(self, v: torch.Tensor, n: int) -> RowRef | None:
        """Queue ``v`` on its device's Triton kernel; None (and the staging path from then on, for
        that device) where the kernel cannot be compiled or launched: Triton builds its launcher
        with the machine's C compiler at first use, which a training image may lack."""
        key = (v.device, None)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(v.device, None)
        p = g.partials
        assert p is not None
        programs = p.programs(n)
        if p.full(programs) and p.used:
            self._flush_group(g)
        try:
            p.add(v, programs)
        except Exception as exc:  # noqa: BLE001 - any failure of Triton's compile or launch
            self._triton_devices[v.device] = False
            _log.warning("torchparity: statistics on %s take the staging path: the Triton kernel failed (%s: %s)",
                         v.device, type(exc).__name__, " ".join(str(exc).split())[:200])
            return None
        self.queued += 1
        self.added += 1
        g.lengths.append(n)
        return RowRef(g.chunk, len(g.lengths) - 1)

    def _single(self, g: _Group, v: torch.Tensor) -> RowRef | None:
        st = stats_tensor(v)
        if st is None:
            return None
        g.singles.append(st)
        return RowRef(g.chunk, -len(g.singles))

    # ---- flush -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Reduce every group's staged values and start their transfer to the host."""
        for g in self._groups.values():
            if g.lengths or g.singles:
                self._flush_group(g)
        self.queued = 0

    def _flush_group(self, g: _Group) -> None:
        k, m = len(g.lengths), len(g.singles)
        chunk = g.chunk
        chunk.n_staged = k
        rows = k + m
        if g.result is None or g.result.shape[0] < rows:
            cap = 64 if g.result is None else g.result.shape[0]
            while cap < rows:
                cap *= 2
            rd = torch.float64 if g.dtype in (torch.float64, None) or g.device.type in _FLOAT64_DEVICES \
                else torch.float32
            g.result = _alloc(cap * 6, rd, g.device).view(cap, 6)
        out = g.result[:rows]
        with torch.no_grad():
            if g.partials is not None:
                g.partials.reduce(out, self.force_fallback)
            elif k:
                assert g.staging is not None
                staged = g.staging[:g.used]
                self._reduce(staged.view(-1, g.width), g.lengths, g.rows, g.device, out[:k])
                staged.zero_()  # the padding of the next values (one memset per flush)
            if m:
                torch.stack([s.to(out.dtype) for s in g.singles], out=out[k:])
            chunk.host, chunk.event = _to_host(out)
        self.flushes += 1
        g.used, g.lengths, g.rows, g.singles, g.chunk = 0, [], [], [], _Chunk()

    def _reduce(self, x: torch.Tensor, lengths: list[int], rows: list[int], device: torch.device,
                out: torch.Tensor) -> None:
        """``out[i] = [max, min, mean, norm, nan, inf]`` of value ``i``, staged in ``rows[i]``
        consecutive rows of the matrix ``x`` (``lengths[i]`` elements, then zeros): a constant
        number of kernels (about 34) whatever the number of values."""
        k, (n_rows, w) = len(lengths), x.shape
        last, pos = [], -1
        for r in rows:
            pos += r
            last.append(pos)
        valid = [n - (r - 1) * w for n, r in zip(lengths, rows)]
        meta = to_device(torch.tensor(lengths + rows + last + valid + rows * 4, dtype=torch.int64), device)
        lens, nrows, last_row, valid_t = meta[:k], meta[k:2 * k], meta[2 * k:3 * k], meta[3 * k:4 * k]
        seg = Segments(nrows, k, n_rows, device, self.force_fallback)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        acc = torch.float64 if device.type in _FLOAT64_DEVICES else work
        row_min, row_max = safe_aminmax(x, dim=1)  # of the padded rows (fixed below for max/min)
        # Sums and squares without overflow or underflow and without a float64 copy of the
        # staging buffer: each row divided by an exact power of two near its largest magnitude
        # (the padding's zeros never change a largest magnitude), so that float32 sums of the
        # quotients' squares stay in range (attention masks of finfo.min, 1e20 in float32, tiny
        # values); the rows' results are scaled back and summed in float64 where the device has it.
        # (an Inf counts as the dtype's largest value: a row holding Inf and a huge finite value
        # must not overflow that value in the division)
        amag = torch.maximum(row_max, row_min.neg()).clamp_(max=torch.finfo(x.dtype).max)
        rscale = pow2_scale(amag, work)
        y = x / rscale.unsqueeze(1)  # float32 (float64) quotients in [-1, 1], one kernel
        # per row: sum, norm, NaN and Inf counts (exact in float32: at most 1024), one stack
        parts = torch.stack([torch.sum(y, dim=1), torch.linalg.vector_norm(y, 2, dim=1),
                             torch.isnan(x).sum(dim=1, dtype=work), torch.isinf(x).sum(dim=1, dtype=work)]).to(acc)
        # max/min: the last row of each value again, its padding replaced by the value's first
        # element there (always a value element: a last row holds at least one)
        tail = x.index_select(0, last_row)
        pad = self._columns(w, device) >= valid_t.unsqueeze(1)
        tail_min, tail_max = safe_aminmax(torch.where(pad, tail[:, :1], tail), dim=1)
        row_max.index_copy_(0, last_row, tail_max)
        row_min.index_copy_(0, last_row, tail_min)
        mx = seg.reduce(row_max, "max")
        mn = seg.reduce(row_min, "min")
        if acc == torch.float64 and work == torch.float32:
            # a row's sum times its scale is below 1024 * 2**128 and its square below 2**276:
            # float64 holds both, so the rows are summed as they are
            vscale = None
            parts[:2].mul_(rscale)
        else:  # float64 values, or a device without float64: the rows to their value's scale first
            vscale = seg.reduce(rscale, "max")
            parts[:2].mul_(rscale / torch.repeat_interleave(vscale, nrows, output_size=n_rows))
        parts[1].square_()
        per_value = Segments(meta[4 * k:], 4 * k, 4 * n_rows, device, self.force_fallback)
        total_sum, sq, nan, inf = per_value.reduce(parts.view(-1), "sum").view(4, k)
        rd = out.dtype  # float64 where the device has it: a norm past float32's range stays finite
        mean = total_sum.to(rd) / lens
        norm = torch.sqrt(sq.to(rd))
        if vscale is not None:
            vscale = vscale.to(rd)
            mean *= vscale
            norm *= vscale
        torch.stack([mx.to(rd), mn.to(rd), mean, norm, nan.to(rd), inf.to(rd)], dim=1, out=out)

    def _columns(self, w: int, device: torch.device) -> torch.Tensor:
        """``arange(w)`` on ``device``, made once."""
        key = (w, device)
        c = self._arange.get(key)
        if c is None:
            with torch.inference_mode(False):
                c = self._arange[key] = torch.arange(w, device=device).unsqueeze(0)
        return c


def _to_host(rows: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """ONE device-to-host copy of the flush's rows, and the event to wait on before reading
    (None when the copy is already complete)."""
    if rows.device.type == "cuda":
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
    # the CPU (device_stats on: the accelerator path run on the host) or a device without events
    return rows.to("cpu", copy=True), None
