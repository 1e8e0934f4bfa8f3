"""What is recorded per gradient: exact statistics plus a count-sketch of its direction.

The sketch of a gradient ``g`` (``n`` elements, flattened and zero-padded to ``b * k``) is

    s[j] = sum_b  r[b] * g[b * k + j]        (j = 0 .. k-1, r[b] = +-1 fixed per parameter)

i.e. a count sketch whose bucket is the position modulo ``k`` and whose sign is a fixed random
sign per block of ``k`` consecutive elements. Two elements that share a bucket lie in different
blocks, so their signs are independent and ``E[<S a, S b>] = <a, b>``: the cosine of two sketches
estimates the cosine of the two gradients, and the fraction of sketch coordinates with equal
signs estimates ``1 - angle / pi`` (the sign agreement of a random projection). The sketch is
linear, costs one multiply-add per element, needs no index tables (only ``n / k`` random signs
per parameter), and is computed on the gradient's device in float32 (float64 gradients stay
float64). The random signs depend only on the seed and the parameter's name, so two runs sketch
the same parameter identically.
"""

from __future__ import annotations

import zlib

import torch

#: per-gradient statistics, in this order (the ``stats`` matrix of a step file)
STATS = ("numel", "norm", "max", "min", "mean", "abs_mean", "nan", "inf", "zero_frac", "pos_frac")
SKETCH_KIND = "countsketch-blocksign-v1"


def block_signs(name: str, numel: int, k: int, seed: int) -> torch.Tensor:
    """The +-1 signs of ``name``'s blocks (CPU, float32), from the seed and the name only."""
    nb = max(1, -(-numel // k))
    g = torch.Generator(device="cpu")
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode("utf-8"))) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randint(0, 2, (nb,), generator=g, dtype=torch.int64).to(torch.float32).mul_(2).sub_(1)


def _flat(grad: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """The gradient as one dense 1-D tensor in its working dtype (float64 stays, else float32)."""
    g = grad.detach()
    if g.is_sparse:
        g = g.to_dense()
    g = g.reshape(-1)
    work = torch.float64 if g.dtype == torch.float64 else torch.float32
    return g.to(work), work


@torch.no_grad()
def summarize(grad: torch.Tensor, signs: torch.Tensor, k: int) -> torch.Tensor:
    """``len(STATS) + k`` numbers for one gradient, on its device (no host synchronisation)."""
    g, work = _flat(grad)
    n = g.numel()
    if n == 0:
        return torch.zeros(len(STATS) + k, dtype=work, device=g.device)
    finite = torch.isfinite(g)
    nan = torch.isnan(g).sum()
    inf = torch.isinf(g).sum()
    stats = torch.stack([
        torch.full((), float(n), dtype=work, device=g.device),
        torch.linalg.vector_norm(g),
        g.max(), g.min(), g.mean(), g.abs().mean(),
        nan.to(work), inf.to(work),
        (g == 0).sum().to(work) / n, (g > 0).sum().to(work) / n,
    ])
    nb = signs.numel()
    pad = nb * k - n
    gz = torch.where(finite, g, torch.zeros((), dtype=work, device=g.device))  # NaN/Inf counted above
    if pad:
        gz = torch.nn.functional.pad(gz, (0, pad))
    sketch = (gz.view(nb, k) * signs.to(device=g.device, dtype=work).view(nb, 1)).sum(0)
    return torch.cat([stats, sketch])


#: gradient levels (msprobe's ``grad_level``): what is recorded besides the statistics and sketch
LEVELS = ("L0", "L1", "L2")
#: msprobe's default value-distribution bounds
DEFAULT_BOUNDS = (-1.0, 0.0, 1.0)


def check_bounds(bounds: object, where: str = "bounds") -> list[float]:
    """``bounds`` as a list of floats, strictly increasing, finite and within int64's range."""
    import math

    if not isinstance(bounds, (list, tuple)) or not bounds:
        raise ValueError(f"{where} must be a non-empty list of numbers in increasing order, e.g. [-1, 0, 1]")
    out: list[float] = []
    for b in bounds:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or abs(b) > 2 ** 63 - 1:
            raise ValueError(f"{where}: {b!r} is not a finite number within int64's range")
        out.append(float(b))
    if any(a >= b for a, b in zip(out, out[1:])):
        raise ValueError(f"{where} must be strictly increasing (got {list(bounds)})")
    return out


def interval_names(bounds: list[float]) -> list[str]:
    """msprobe's column names of the value distribution: ``(-inf, b0]``, ``(b0, b1]``, ..., ``(bn, inf)``."""
    fmt = [f"{b:g}" for b in bounds]
    names = [f"(-inf, {fmt[0]}]"]
    names += [f"({a}, {b}]" for a, b in zip(fmt, fmt[1:])]
    names.append(f"({fmt[-1]}, inf)")
    return names


@torch.no_grad()
def distribution(grad: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Fraction of the elements in each interval ``(-inf, b0], (b0, b1], ..., (bn, inf)``
    (``len(bounds) + 1`` numbers, on the gradient's device; NaN elements are in none)."""
    g, work = _flat(grad)
    nb = bounds.numel() + 1
    if g.numel() == 0:
        return torch.zeros(nb, dtype=work, device=g.device)
    idx = torch.bucketize(g, bounds.to(device=g.device, dtype=work), right=False)  # b[i-1] < x <= b[i]
    idx = torch.where(torch.isnan(g), torch.full_like(idx, nb), idx)
    return torch.bincount(idx, minlength=nb + 1)[:nb].to(work) / g.numel()


def md5_of(grad: torch.Tensor) -> str:
    """MD5 of the gradient's bytes (row-major, its own dtype): equal MD5 = bitwise equal gradient."""
    import hashlib

    t = grad.detach()
    if t.is_sparse:
        t = t.to_dense()
    t = t.reshape(-1).contiguous().cpu()
    return hashlib.md5(t.view(torch.uint8).numpy().tobytes()).hexdigest()
