"""Tensor statistics computed on the tensor's own device, without a host sync per tensor.

:func:`stats_tensor` returns a small device tensor ``[max, min, mean, norm, nan, inf]`` (about ten
kernels: the batcher of :mod:`.stat_batch` uses it only for a value larger than its staging budget).
:func:`host_stats` is the CPU path: reading a CPU scalar costs no device sync, so the values are
read at once, with as few passes over the tensor as possible (``aminmax``, ``sum``, ``dot``).
"""

from __future__ import annotations

import hashlib
import math

import torch

from ..records import STAT_KEYS

_FLOAT_ACC_DEVICES = {"cpu", "cuda"}  # devices where float64 accumulation is cheap and supported


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    if t.dtype == torch.float64 or t.device.type in _FLOAT_ACC_DEVICES:
        return torch.float64 if t.dtype == torch.float64 else torch.float32
    return torch.float32


def safe_aminmax(t: torch.Tensor, dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of ``t`` (of each slice along ``dim``): one kernel."""
    try:
        return torch.aminmax(t, dim=dim)
    except (RuntimeError, NotImplementedError):  # e.g. torch < 2.2 has no CPU aminmax for float16
        return torch.aminmax(t.float(), dim=dim)


def pow2_scale(amag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An exact power of two at most each largest magnitude ``amag`` (half its binade's top), in
    ``dtype``, to divide values by before their squares are summed: finite and non-zero whatever
    ``amag`` holds (0 and NaN give exponent 0, so 1/2: a value holding NaN has a NaN sum whatever
    it is divided by; clamp Inf to the dtype's largest value first). frexp/exp2 rather than
    torch.ldexp, whose int power overflows on torch 2.1."""
    _, exp = torch.frexp(amag)
    exp = exp - 1
    # exp2 of an int tensor is float32 (the default dtype) without a cast kernel
    return torch.exp2(exp if dtype == torch.float32 else exp.to(dtype)).to(dtype)


def stats_tensor(t: torch.Tensor) -> torch.Tensor | None:
    """``[max, min, mean, norm, nan_count, inf_count]`` as a float tensor on ``t``'s device.

    Returns None for tensors without statistics (empty, complex, meta, sparse). Integer and bool
    tensors are measured in floating point (bool as 0/1).
    """
    if t.numel() == 0 or t.is_complex() or t.device.type == "meta" or t.layout != torch.strided:
        return None
    t = t.detach()
    if t.dtype.is_floating_point and t.element_size() == 1:  # float8: no reductions, no promotion
        t = t.float()
    if t.dtype.is_floating_point:
        acc = _acc_dtype(t)
        mn, mx = safe_aminmax(t)
        # the mean in float64 where the device has it: a float32 sum of finfo.min attention masks
        # overflows (the host path and the batched path give the finite mean)
        mean = t.mean(dtype=torch.float64 if t.device.type in _FLOAT_ACC_DEVICES else acc)
        if t.dtype == torch.float64:
            # squares of float64 values past 1e154 overflow float64 itself: the norm of the value
            # divided by an exact power of two near its largest magnitude
            scale = pow2_scale(torch.maximum(mx, mn.neg()).clamp(max=torch.finfo(t.dtype).max), torch.float64)
            norm = torch.linalg.vector_norm(t / scale) * scale
        else:
            # float64 where it is cheap: squares of huge float32/bfloat16 values overflow float32
            norm = torch.linalg.vector_norm(t, dtype=torch.float64 if t.device.type in _FLOAT_ACC_DEVICES else acc)
        if t.device.type == "cpu" and math.isfinite(mx.item()) and math.isfinite(mn.item()):
            # On the CPU reading a value costs no device sync. max/min propagate NaN and show
            # +-Inf, so finite extremes mean there is nothing to count: skip two full passes.
            nan = inf = torch.zeros((), dtype=acc)
        else:
            nan = torch.count_nonzero(torch.isnan(t))
            inf = torch.count_nonzero(torch.isinf(t))
        rd = torch.float64 if t.device.type in _FLOAT_ACC_DEVICES else acc  # a norm past float32's range
        return torch.stack([mx.to(rd), mn.to(rd), mean.to(rd), norm.to(rd), nan.to(rd), inf.to(rd)])
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    acc = torch.float64 if t.device.type in _FLOAT_ACC_DEVICES else torch.float32
    f = t.to(acc)
    mn, mx = torch.aminmax(f)
    zero = torch.zeros((), dtype=acc, device=t.device)
    return torch.stack([mx, mn, f.mean(), torch.linalg.vector_norm(f), zero, zero])


#: below this magnitude, squares fall out of float32's normal range (2**-63 squared is 2**-126)
_UNDERFLOW = 2.0 ** -60

_SMALL = 32  # tensors up to this many elements are measured in Python (0-d optimizer state, scalars)
# From this many elements on, ``amax`` and ``amin`` (two passes) beat ``aminmax`` (one) on the CPU:
# 262144 float32, 2 threads: 18.7 us against 23.0 us; 1M: 54 against 79 us (torch 2.13, AMD EPYC)
_SPLIT_MINMAX = 1 << 18


def _small_stats(vals: list[float]) -> list[float] | None:
    """Statistics of a few host values (None if a sum overflows: the caller uses tensors)."""
    n = len(vals)
    try:
        finite = [x for x in vals if math.isfinite(x)]
        if len(finite) == n:
            return [max(vals), min(vals), math.fsum(vals) / n, math.sqrt(math.fsum(x * x for x in vals)), 0.0, 0.0]
        nan = float(sum(1 for x in vals if x != x))
        if nan:
            return [math.nan, math.nan, math.nan, math.nan, nan, float(n - len(finite)) - nan]
        total = math.nan if (math.inf in vals and -math.inf in vals) else math.fsum(vals)
        return [max(vals), min(vals), total / n, math.inf, 0.0, float(n - len(finite))]
    except (OverflowError, ValueError):
        return None


def host_stats(t: torch.Tensor) -> list[float] | None:
    """``[max, min, mean, norm, nan_count, inf_count]`` of a CPU tensor as Python floats.

    Three passes for float32/float64 (``aminmax`` -- or ``amax`` and ``amin``, faster from
    ``_SPLIT_MINMAX`` elements on --, ``sum``, and ``dot`` of the flattened tensor
    with itself for the squared norm, which is about twice as fast as ``vector_norm`` on the CPU);
    NaN/Inf are counted only when an extreme is not finite (max/min propagate NaN and show Inf).
    Tensors of at most ``_SMALL`` elements are measured in Python (exact sums in double).
    Same values as :func:`stats_tensor` up to float rounding of the accumulation order.
    """
    n = t.numel()
    if n == 0 or t.is_complex() or t.layout != torch.strided:
        return None
    t = t.detach()
    dt = t.dtype
    if n <= _SMALL:  # a handful of values: Python is faster than six kernel calls
        small = _small_stats([float(x) for x in t.reshape(-1).tolist()])
        if small is not None:
            return small
    if not dt.is_floating_point:
        st = stats_tensor(t)
        return None if st is None else st.tolist()
    if t.element_size() == 1:  # float8: no reductions, no promotion; float32 holds it exactly
        t, dt = t.float(), torch.float32
    if n >= _SPLIT_MINMAX and (dt == torch.float32 or dt == torch.float64):
        mx, mn = t.amax(), t.amin()  # both propagate NaN, as aminmax does; the extremes are exact
    else:
        try:  # safe_aminmax(), inlined
            mn, mx = torch.aminmax(t)
        except (RuntimeError, NotImplementedError):  # e.g. torch < 2.2 has no CPU aminmax for float16
            mn, mx = torch.aminmax(t.float())
    hi, lo = mx.item(), mn.item()
    if dt == torch.float32 or dt == torch.float64:
        total = t.sum().item()
        if t.is_contiguous():
            flat = t.view(-1)
            sq = torch.dot(flat, flat).item()
            norm = math.sqrt(sq) if math.isfinite(sq) or not (math.isfinite(hi) and math.isfinite(lo)) \
                else torch.linalg.vector_norm(t, dtype=torch.float64).item()  # squares overflowed
        else:
            norm = torch.linalg.vector_norm(t).item()
    else:  # float16 / bfloat16 / float8: accumulate in float32
        total = t.sum(dtype=torch.float32).item()
        norm = torch.linalg.vector_norm(t, dtype=torch.float32).item()
    if math.isfinite(hi) and math.isfinite(lo):
        if not (math.isfinite(total) and math.isfinite(norm)):  # the sum or the squares overflowed
            total = t.sum(dtype=torch.float64).item()
            norm = torch.linalg.vector_norm(t, dtype=torch.float64).item()
            if not math.isfinite(norm):  # float64 squares overflowed too (|values| ~1e155+): scale
                amax = max(-lo, hi)
                norm = amax * torch.linalg.vector_norm(t.double() / amax).item()
        elif 0.0 < max(-lo, hi) < _UNDERFLOW and dt != torch.float64:
            # squares of values this small underflow float32 (Adam's exp_avg_sq early on: ~1e-26
            # gives a norm of 0): take them in float64
            norm = torch.linalg.vector_norm(t, dtype=torch.float64).item()
        nan = inf = 0.0
    else:
        nan = float(torch.count_nonzero(torch.isnan(t)).item())
        inf = float(torch.count_nonzero(torch.isinf(t)).item())
    return [hi, lo, total / n, norm, nan, inf]


def stats_to_dict(values: list[float] | None) -> dict[str, float | None] | None:
    """Host list of 6 floats -> the record's ``stats`` dict."""
    if values is None:
        return None
    d: dict[str, float | None] = dict(zip(STAT_KEYS, values))
    d["nan"] = int(d["nan"])  # type: ignore[arg-type]
    d["inf"] = int(d["inf"])  # type: ignore[arg-type]
    return d


try:  # xxHash's XXH3 hashes ~50x faster than MD5 (tens of GB/s); its digest is 16 hex digits
    from xxhash import xxh3_64_hexdigest as _xxh3_64

    #: the algorithm behind the ``md5`` field (the name is msprobe's, whose "md5" is a CRC-32)
    CHECKSUM_ALGORITHM = "xxh3_64"
except ImportError:  # pragma: no cover - xxhash is a dependency; stay usable without it
    _xxh3_64 = None
    CHECKSUM_ALGORITHM = "md5"


def checksum_bytes(buf: "bytes | memoryview | object") -> str:
    """The checksum of raw bytes (a uint8 numpy array, or ``bytes``): the ``md5`` field's value."""
    if _xxh3_64 is not None:
        return _xxh3_64(buf)
    return hashlib.md5(buf).hexdigest()


def tensor_checksum(t: torch.Tensor) -> str:
    """Checksum of the tensor's raw bytes (row-major order, native dtype): XXH3-64 as 16 hex
    digits (MD5, 32 digits, without the xxhash package). Equal bytes give equal checksums on every
    device; a CPU tensor is hashed in place (a copy only if it is not contiguous), others are
    copied to the host first (blocking: a dump hashes values off the CPU from asynchronous host
    copies instead, see :mod:`.host_copies`)."""
    if t.numel() == 0:  # nothing to bring to the host
        return checksum_bytes(b"")
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return checksum_bytes(flat.contiguous().view(torch.uint8).numpy())


tensor_md5 = tensor_checksum  # the name used before the algorithm changed
