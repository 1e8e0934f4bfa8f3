"""A bitwise fingerprint of a tensor, computed on the tensor's own device.

The tensor's bytes are read as integers (the tensor viewed as an integer dtype of the same
element size, so ``-0.0`` and ``0.0``, or two NaN payloads, hash differently: it is the bits that
are compared, not the values), widened to int64, multiplied element-wise by pseudo-random odd
int64 weights that depend on the element's position (splitmix64 of the position) and summed
with int64 wrap-around. Integer arithmetic modulo 2**64 is exact and order-free, so the hash of
equal bits is equal on every device and for every reduction order.

A change of one element always changes the hash: the bits' difference ``d`` is non-zero and
smaller than 2**64 in magnitude, and an odd weight times ``d`` is non-zero modulo 2**64. Several
changed elements cancel only with probability about 2**-64 (the weights are pseudo-random).

Weights are cached per device for a block of :data:`BLOCK` positions; a longer tensor is hashed
block by block and the block sums are weighted by a second splitmix64 sequence, so memory for
weights is bounded (8 MiB per device) whatever the model size.

A tensor on the CPU is hashed by XXH3-64 of its raw bytes instead (seeded with the dtype and shape),
in place: ~10 GB/s against ~0.1 GB/s for the weighted sum's three int64 passes there (the bench
model's 4 M parameters and gradients: ~125 ms per step before, a few ms after). The replicas of a
data-parallel group live on one kind of device, so each group compares hashes of one kind; the
dump records which (``algorithm``).
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

try:  # a core dependency; the weighted sum below stands in without it
    from xxhash import xxh3_64_intdigest as _xxh3_int
except ImportError:  # pragma: no cover
    _xxh3_int = None

#: hash algorithm name written next to the hashes (a reader refuses hashes of another algorithm)
ALGORITHM = "tp-bits64-v2"
BLOCK = 1 << 20
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_WEIGHTS: dict[tuple[str, int], torch.Tensor] = {}
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: the hash of a missing tensor (a parameter without a gradient): a fixed value, told apart from
#: a real hash by the presence flag that travels with it
MISSING = 0


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def splitmix64(index: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """splitmix64 of int64 positions (wrap-around arithmetic), forced odd."""
    z = index * _GOLDEN + salt
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    z = z ^ _shr(z, 31)
    return z | 1


def _weights(device: torch.device, n: int, salt: int) -> torch.Tensor:
    """The first ``n`` (<= BLOCK) weights of a salted sequence, cached per device."""
    key = (f"{device}:{salt}", BLOCK)
    w = _WEIGHTS.get(key)
    if w is None:
        w = splitmix64(torch.arange(BLOCK, dtype=torch.int64, device=device), salt)
        _WEIGHTS[key] = w
    return w[:n]


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a flat int64 tensor (one element per element; complex: two)."""
    if hasattr(t, "to_local"):  # a DTensor: this rank's shard
        t = t.to_local()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    flat = t.detach().reshape(-1)
    size = flat.element_size()
    view = _INT_VIEW.get(size)
    if view is None:
        raise TypeError(f"cannot hash a tensor of dtype {t.dtype}")
    if flat.dtype != view:
        flat = flat.view(view)
    return flat if flat.dtype == torch.int64 else flat.to(torch.int64)


def tensor_hash(t: torch.Tensor) -> torch.Tensor:
    """The bitwise fingerprint of ``t`` as a 0-dim int64 tensor on ``t``'s device (no host sync).

    The dtype and shape are mixed in, so a reshaped or re-typed tensor with the same bits
    hashes differently."""
    if _xxh3_int is not None and t.device.type == "cpu" and not hasattr(t, "to_local"):
        return torch.tensor(_cpu_hash(t), dtype=torch.int64)
    bits = _as_int64(t)
    n = bits.numel()
    dev = bits.device
    if n <= BLOCK:
        h = (bits * _weights(dev, n, 0)).sum()
    else:
        full = n // BLOCK * BLOCK
        blocks = (bits[:full].view(-1, BLOCK) * _weights(dev, BLOCK, 0)).sum(dim=1)
        h = (blocks * splitmix64(torch.arange(blocks.numel(), dtype=torch.int64, device=dev), 1)).sum()
        if full < n:
            tail = (bits[full:] * _weights(dev, n - full, 0)).sum()
            h = h + tail * splitmix64(torch.tensor(blocks.numel(), dtype=torch.int64, device=dev), 1)
    meta = hash_meta(t)
    return h * _GOLDEN + meta


def _cpu_hash(t: torch.Tensor) -> int:
    """XXH3-64 of a CPU tensor's bytes (row-major), seeded with its dtype and shape, as a signed int64."""
    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    h = _xxh3_int(raw.numpy(), seed=hash_meta(t))
    return h - (1 << 64) if h >= (1 << 63) else h


def hash_meta(t: torch.Tensor) -> int:
    """A small integer for the dtype and shape (mixed into the hash)."""
    import zlib

    return zlib.crc32(f"{t.dtype}{tuple(t.shape)}".encode())


def stacked_hashes(tensors: Iterable[Optional[torch.Tensor]], device: torch.device | None = None) -> torch.Tensor:
    """A ``(2, P)`` int64 tensor: row 0 the hash of each tensor, row 1 1 when present (0 for None).

    Computed where the tensors live; the result is moved to ``device`` (the collective's device)
    when given. One small tensor, for one collective."""
    hashes: list[torch.Tensor] = []
    present: list[int] = []
    for t in tensors:
        if t is None or (hasattr(t, "is_sparse") and t.is_sparse):
            hashes.append(torch.tensor(MISSING, dtype=torch.int64))
            present.append(0)
        else:
            hashes.append(tensor_hash(t))
            present.append(1)
    if not hashes:
        return torch.zeros((2, 0), dtype=torch.int64, device=device)
    target = device if device is not None else hashes[0].device
    row = torch.stack([h.to(target) for h in hashes])
    return torch.stack([row, torch.tensor(present, dtype=torch.int64, device=target)])


def hex64(v: int) -> str:
    """An int64 hash as 16 hex digits (two's complement), the form written to files."""
    return f"{v & 0xFFFFFFFFFFFFFFFF:016x}"
