"""One-pass statistics of a value with a Triton kernel: the CUDA fast path of the statistics batcher.

The staging path of :mod:`.stat_batch` copies each value into a staging matrix and reduces that
matrix at flush: about fifteen passes over every byte of every value. On a GPU-bound step that is
the tool's whole cost (an H200, ~1 B-parameter Llama at batch 8x1024: module-level statistics took
the step from 236 ms to 1397 ms, bench/results/session12/). Here ONE kernel per value reads the
value once, in its own dtype, where it lies (contiguous, or dense in another order: a transpose,
channels_last; statistics do not depend on the order), and writes a few *partial*
rows ``[max, min, sum, sum of squares, NaN count, Inf count]`` (float64) into a preallocated
buffer: one row per program of its grid. At flush a constant number of torch ops combines each
value's partial rows into its statistics row. The kernel runs in stream order, so a later in-place
write to the value cannot change what it measured; nothing is read by the host until the batcher's
one device-to-host copy per flush.

Numerics are those of :func:`~.stats.host_stats`: max/min ignore NaN and are NaN when the value
holds one; sums and squares are accumulated in float64 (a bfloat16 finfo.min mask squared is
~1e77: exact in float64, Inf in float32), so the mean and norm are right for every float32,
bfloat16 and float16 value. float64 values (whose squares can overflow float64 itself), integer,
bool and float8 values, views with gaps or overlap and tensor subclasses take the staging path.

Triton ships with CUDA builds of torch. Without it, for another device, or where it cannot
compile or launch (it builds its launcher with the machine's C compiler), the staging path is
used. The kernel's language is what Triton has had since 2.1 (the Triton of torch 2.1); only the
GPUs of sessions 11-12 (an H200, Triton 3.6) have run it. On a machine
without a GPU it runs under Triton's interpreter when ``TRITON_INTERPRET=1`` is set before the
import, which is how the tests check it on the CPU (tests/capture/triton_cases.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .segments import Segments, to_device

triton: Any = None  # imported at first use (some 0.15 s): CPU-only runs never pay it
tl: Any = None
_loaded: bool | None = None  # None: not tried yet

# The best of five shapes timed on an H200 (bench/results/session12/run4/stat_kernel.md: 2048/8/8
# read 490 GB/s of 4 M-element and 790 GB/s of 64 M-element bfloat16 values; 1024/4/8 370 and 690)
BLOCK = 2048  # elements per load of a program (each loop iteration loads two)
NUM_WARPS = 8  # warps per program
PROGRAMS_PER_SM = 8  # at most this many programs per multiprocessor in a value's grid
COLS = 6  # partial row: max, min, sum, sum of squares, NaN count, Inf count
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TL_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Offsets and the loop counter are int32, and a program's counter goes one step (programs x 2 x
# BLOCK elements) past the value: values stop 2**27 short of 2**31, room for a step of up to
# MAX_PROGRAMS programs x 2 x 4096 elements (BLOCK is at most 4096).
MAX_PROGRAMS = 1 << 14
MAX_NUMEL = 2**31 - 2**27
_FIRST_ROWS = 1 << 12  # partial rows allocated at first use (doubled as needed, up to LIMIT_ROWS)
LIMIT_ROWS = 1 << 16  # partial rows before the batcher flushes (3 MB of float64)
_PLANS_KEPT = 64  # chunk tables kept per device (one per list of value sizes: a graph's captured values)
_accumulate: Any = None  # the kernels, defined by _load()
_stats_partials: Any = None
_stats_partials_multi: Any = None
_partial_row: Any = None


def _load() -> bool:
    """Import Triton and define the kernel (once); False where Triton is absent or cannot load."""
    global triton, tl, _loaded, _accumulate, _partial_row, _stats_partials, _stats_partials_multi
    if _loaded is not None:
        return _loaded
    try:  # Triton ships with the CUDA builds of torch; absent on CPU-only installs
        import triton as _triton
        import triton.language as _tl
    except Exception:  # ImportError, or a Triton that cannot load on this machine
        _loaded = False
        return False
    triton, tl = _triton, _tl
    # Both kernels are module globals (Triton resolves a kernel's callees among its globals).
    # _stats_partials: each program walks the value two blocks at a time (two independent loads in flight per
    # thread: a reduction is bound by the bytes in flight, not by its arithmetic), keeping per-lane
    # accumulators, and reduces them to its one partial row at the end.

    @triton.jit
    def _accumulate(x, inside, mx, mn, s, sq, nans, infs):  # type: ignore[no-untyped-def]
        x = x.to(tl.float32)
        ok = inside & (x == x)
        mx = tl.maximum(mx, tl.where(ok, x, float("-inf")))
        mn = tl.minimum(mn, tl.where(ok, x, float("inf")))
        xd = x.to(tl.float64)  # lanes outside the value were loaded as 0
        s += xd
        sq += xd * xd
        nans += (x != x).to(tl.int32)
        infs += ((x == float("inf")) | (x == float("-inf"))).to(tl.int32)
        return mx, mn, s, sq, nans, infs

    # _partial_row: one program's walk over elements first, first + step, ... (two blocks at a
    # time) of the value at x_ptr, below end; it writes its partial row at ``row``
    @triton.jit
    def _partial_row(x_ptr, first, end, step, row, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        lanes = tl.arange(0, BLOCK)
        mx = tl.zeros([BLOCK], dtype=tl.float32) - float("inf")
        mn = tl.zeros([BLOCK], dtype=tl.float32) + float("inf")
        s = tl.zeros([BLOCK], dtype=tl.float64)
        sq = tl.zeros([BLOCK], dtype=tl.float64)
        nans = tl.zeros([BLOCK], dtype=tl.int32)
        infs = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(first, end, step):
            oa = start + lanes
            ob = oa + BLOCK
            xa = tl.load(x_ptr + oa, mask=oa < end, other=0.0)
            xb = tl.load(x_ptr + ob, mask=ob < end, other=0.0)
            mx, mn, s, sq, nans, infs = _accumulate(xa, oa < end, mx, mn, s, sq, nans, infs)
            mx, mn, s, sq, nans, infs = _accumulate(xb, ob < end, mx, mn, s, sq, nans, infs)
        tl.store(row, tl.max(mx, axis=0).to(tl.float64))
        tl.store(row + 1, tl.min(mn, axis=0).to(tl.float64))
        tl.store(row + 2, tl.sum(s, axis=0))
        tl.store(row + 3, tl.sum(sq, axis=0))
        tl.store(row + 4, tl.sum(nans, axis=0).to(tl.float64))
        tl.store(row + 5, tl.sum(infs, axis=0).to(tl.float64))

    # ``n`` is specialized (Triton compiles a variant for n % 16 == 0, where masked loads are
    # vectorized: 2 16-byte loads per thread and iteration instead of 16 2-byte ones)
    @triton.jit(do_not_specialize=["row0"])
    def _stats_partials(x_ptr, out_ptr, n, row0, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        pid = tl.program_id(0)
        _partial_row(x_ptr, pid * (2 * BLOCK), n, tl.num_programs(0) * (2 * BLOCK), out_ptr + (row0 + pid) * 6,
                     BLOCK)

    # _stats_partials_multi: many values of one dtype in one launch (a compiled graph's captured
    # values: one launch per group of values instead of one per value). Program ``pid`` reads the
    # chunk ``tab[pid] = (value, start, end)`` of the value whose address is ``ptrs[value]``, in
    # int64 offsets, and writes partial row ``row0 + pid``; a value's chunks are consecutive programs.
    # ALIGNED: every value's address and size are multiples of 16 (the caller checked), so every
    # chunk's bounds are too and its loads can be whole 16-byte vectors, as Triton's own
    # specialization gives the one-value kernel (bench/triton_ptx.py shows the loads)
    @triton.jit(do_not_specialize=["row0"])
    def _stats_partials_multi(ptrs, tab, out_ptr, row0, BLOCK: tl.constexpr,  # type: ignore[no-untyped-def]  # noqa: N803
                              DTYPE: tl.constexpr, ALIGNED: tl.constexpr):  # noqa: N803
        pid = tl.program_id(0)
        x_ptr = tl.load(ptrs + tl.load(tab + pid * 3)).to(tl.pointer_type(DTYPE))
        start = tl.load(tab + pid * 3 + 1)
        end = tl.load(tab + pid * 3 + 2)
        if ALIGNED:
            x_ptr = tl.multiple_of(x_ptr, 16)
            start = tl.multiple_of(start, 16)
            end = tl.multiple_of(end, 16)
        _partial_row(x_ptr, start, end, 2 * BLOCK, out_ptr + (row0 + pid) * 6, BLOCK)

    _loaded = True
    return True


# ---- launching ---------------------------------------------------------------------------------
# ``kernel[grid](...)`` costs some 15 us of Python per launch on a GPU host (Triton's argument
# binding, specialization key, cache lookup and knob reads), as much as the rest of measuring a
# value (bench/results/session12/stat_kernel.md). After that first launch has compiled the kernel
# for a (dtype, pointer alignment, device), the compiled kernel's own launcher is called directly
# with the arguments Triton's ``JITFunction.run`` would give it -- only where the installed
# Triton's ``run`` makes that very call (checked in its source once), while no launch hook is set
# (a profiler's: then Triton's own path runs it), and never again after it raises.
_RUN_CALL = ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
             "launch_metadata,")
_direct: bool | None = None  # None: not checked yet
_runtime_knobs: Any = None  # triton.knobs.runtime (its launch hooks)
_compiled: dict[tuple[torch.dtype, bool, bool, bool, int | None], Any] = {}
_raw_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device: Any = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device  # C call where it can


def _direct_ok() -> bool:
    """Does this Triton launch its compiled kernels the way :func:`_launch` copies? (once)"""
    global _direct, _runtime_knobs
    if _direct is None:
        try:
            import inspect

            from triton import knobs  # Triton >= 3.3
            from triton.runtime.jit import JITFunction

            src = " ".join(inspect.getsource(JITFunction.run).split())
            _runtime_knobs = knobs.runtime  # before _direct: another thread may launch as soon as it is set
            # not on ROCm: Triton's AMD backend also specializes a tensor on its storage size
            _direct = _RUN_CALL in src and "*bound_args.values())" in src and _raw_stream is not None \
                and getattr(torch.version, "hip", None) is None
        except Exception:  # an older or newer Triton: its own launch path only
            _direct = False
    return _direct


def _no_launch_hooks() -> bool:
    """No launch hook is set (Triton >= 3.3 keeps them as chains, empty by default)."""
    rt = _runtime_knobs
    for h in (rt.launch_enter_hook, rt.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return False
    return True


def _launch(v: torch.Tensor, buf: torch.Tensor, n: int, row0: int, programs: int) -> None:
    """One launch of :func:`_stats_partials` over ``programs`` programs."""
    global _direct
    # what Triton specializes this kernel on (NVIDIA): the pointer's 16-byte alignment, n == 1
    # (a constant) and n % 16 == 0 (row0 is not specialized; buf is always aligned)
    key = (v.dtype, v.data_ptr() % 16 == 0, n % 16 == 0, n == 1, v.device.index)
    k = _compiled.get(key)
    if k is not None and _no_launch_hooks():
        try:
            k.run(programs, 1, 1, _raw_stream(v.device.index), k.function, k.packed_metadata, None, None, None,
                  v, buf, n, row0, BLOCK)
            return
        except Exception:  # the launcher wants other arguments: Triton's own path from now on
            _direct = False
            _compiled.clear()
    k = _stats_partials[(programs,)](v, buf, n, row0, BLOCK=BLOCK, num_warps=NUM_WARPS)
    if v.device.type == "cuda" and k is not None and _direct_ok() and hasattr(k, "run") and hasattr(k, "function"):
        _compiled[key] = k


def interpreted() -> bool:
    """Whether the kernel runs under Triton's CPU interpreter: ``TRITON_INTERPRET=1`` when it was
    loaded (the tests' stand-in for a GPU), with a Triton that has one (3 and later)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1" and _load() \
        and int(triton.__version__.split(".")[0]) >= 3


def usable(device: torch.device) -> bool:
    """Whether values on ``device`` can take this path: CUDA with Triton, or the interpreter."""
    if device.type == "cuda":
        return _load()
    return device.type == "cpu" and interpreted()


def eligible(v: torch.Tensor) -> bool:
    """A float32/bfloat16/float16 value of fewer than :data:`MAX_NUMEL` elements that fills its
    memory densely: contiguous, or a permutation of a contiguous layout (a transpose,
    channels_last), whose elements are the same ``numel`` consecutive ones in another order --
    and statistics do not depend on the order."""
    return v.dtype in DTYPES and v.numel() <= MAX_NUMEL and (v.is_contiguous() or _permuted_dense(v))


def _permuted_dense(v: torch.Tensor) -> bool:
    """Are ``v``'s strides a permutation of a contiguous tensor's? (no gaps, no overlap)"""
    expected = 1
    for size, stride in sorted(zip(v.shape, v.stride()), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _max_programs(device: torch.device) -> int:
    if device.type == "cuda":
        try:
            # enough resident programs per multiprocessor to keep its loads in flight
            return min(MAX_PROGRAMS, PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)
        except (RuntimeError, AssertionError, AttributeError):  # pragma: no cover
            return 512
    return 4  # the interpreter: a few programs still exercise the combine


class Partials:
    """The partial rows of one device's values since the last flush."""

    __slots__ = ("device", "buf", "used", "lengths", "parts", "max_programs", "launches", "_plans", "_ptrs")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buf: torch.Tensor | None = None  # float64 [capacity, COLS]
        self.used = 0
        self.lengths: list[int] = []
        self.parts: list[int] = []
        self.max_programs = _max_programs(device)
        self.launches = 0  # kernels launched (for the counting bench)
        #: (dtype, numels) -> (chunk table on the device, chunks per value, chunks in all), for add_many
        self._plans: dict[tuple[torch.dtype, tuple[int, ...]], tuple[torch.Tensor, list[int], int]] = {}
        self._ptrs: tuple[tuple[int, ...], torch.Tensor] | None = None  # the last address table sent

    def programs(self, n: int) -> int:
        """Programs of the value's grid: one per two blocks, at most :func:`_max_programs`."""
        return max(1, min(-(-n // (2 * BLOCK)), self.max_programs))

    def full(self, programs: int) -> bool:
        return self.used + programs > LIMIT_ROWS

    def _room(self, need: int) -> torch.Tensor:
        """The partial-row buffer, grown to at least ``need`` rows."""
        buf = self.buf
        if buf is None or need > buf.shape[0]:
            cap = _FIRST_ROWS if buf is None else buf.shape[0]
            while cap < need:
                cap *= 2
            with torch.inference_mode(False):
                new = torch.empty((cap, COLS), dtype=torch.float64, device=self.device)
            if buf is not None and self.used:
                new[:self.used].copy_(buf[:self.used])
            buf = self.buf = new
        return buf

    def chunks(self, n: int) -> tuple[int, int]:
        """(elements per chunk, chunks) of an ``n``-element value in :meth:`add_many`: as many
        chunks as :meth:`programs` would launch, each a whole number of two-block steps."""
        per = -(-n // self.programs(n))
        per = -(-per // (2 * BLOCK)) * (2 * BLOCK)
        return per, -(-n // per)

    def add_many(self, values: list[torch.Tensor], aligned: bool = False) -> None:
        """ONE launch of :func:`_stats_partials_multi` for ``values`` (one dtype, each
        :func:`eligible`; their partial rows follow the previous values', at most
        :data:`LIMIT_ROWS` in all: the caller splits). The chunk table is made once per list of
        sizes; the table of addresses is sent again only when an address changed. ``aligned``:
        every value's address and size are multiples of 16 (16-byte loads)."""
        dtype = values[0].dtype
        numels = tuple(v.numel() for v in values)
        plan = self._plans.get((dtype, numels))
        if plan is None:
            rows: list[int] = []
            parts: list[int] = []
            for i, n in enumerate(numels):
                per, c = self.chunks(n)
                for j in range(c):
                    rows += (i, j * per, min(n, (j + 1) * per))
                parts.append(c)
            if len(self._plans) >= _PLANS_KEPT:  # the oldest goes (shapes that keep changing)
                del self._plans[next(iter(self._plans))]
            tab = to_device(torch.tensor(rows, dtype=torch.int64), self.device)
            plan = self._plans[(dtype, numels)] = (tab, parts, len(parts) and sum(parts))
        tab, parts, total = plan
        ptrs = tuple(v.data_ptr() for v in values)
        last = self._ptrs
        if last is not None and last[0] == ptrs:
            ptr_table = last[1]
        else:
            ptr_table = to_device(torch.tensor(ptrs, dtype=torch.int64), self.device)
            self._ptrs = (ptrs, ptr_table)
        buf = self._room(self.used + total)
        args = (ptr_table, tab, buf, self.used)
        kw = {"BLOCK": BLOCK, "DTYPE": getattr(tl, _TL_NAMES[dtype]), "ALIGNED": bool(aligned), "num_warps": NUM_WARPS}
        if self.device.type == "cuda" and self.device.index != _current_device():
            with torch.cuda.device(self.device):
                _stats_partials_multi[(total,)](*args, **kw)
        else:
            _stats_partials_multi[(total,)](*args, **kw)
        self.used += total
        self.launches += 1
        self.lengths.extend(numels)
        self.parts.extend(parts)

    def add(self, v: torch.Tensor, programs: int) -> None:
        """Launch the value's kernel (its rows follow the previous value's)."""
        buf = self._room(self.used + programs)
        need = self.used + programs
        if self.device.type == "cuda" and self.device.index != _current_device():
            with torch.cuda.device(self.device):  # launched in the value's device's context
                _launch(v, buf, v.numel(), self.used, programs)
        else:
            _launch(v, buf, v.numel(), self.used, programs)
        self.used = need
        self.launches += 1
        self.lengths.append(v.numel())
        self.parts.append(programs)

    def reduce(self, out: torch.Tensor, fallback: bool = False) -> None:
        """``out[i] = [max, min, mean, norm, nan, inf]`` of value ``i`` from its partial rows
        (``fallback``: the scatter reductions instead of ``torch.segment_reduce``, for tests)."""
        k, total = len(self.lengths), self.used
        assert self.buf is not None
        meta = to_device(torch.tensor(self.lengths + self.parts, dtype=torch.float64), self.device)
        lens, parts = meta[:k], meta[k:].to(torch.int64)
        rows = self.buf[:total]
        seg = Segments(parts, k, total, self.device, fallback)
        mx = seg.reduce(rows[:, 0].contiguous(), "max")
        mn = seg.reduce(rows[:, 1].contiguous(), "min")
        s, sq, nans, infs = seg.reduce(rows[:, 2:].contiguous(), "sum").unbind(1)
        has_nan = nans > 0
        nan = torch.full_like(mx, float("nan"))
        torch.stack([torch.where(has_nan, nan, mx), torch.where(has_nan, nan, mn), s / lens, sq.sqrt(),
                     nans, infs], dim=1, out=out)
        self.used, self.lengths, self.parts = 0, [], []
