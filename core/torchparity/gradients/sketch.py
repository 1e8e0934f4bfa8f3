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


@torch.no_grad()
def summarize(grad: torch.Tensor, signs: torch.Tensor, k: int) -> torch.Tensor:
    """``len(STATS) + k`` numbers for one gradient, on its device (no host synchronisation)."""
    g = grad.detach()
    if g.is_sparse:
        g = g.to_dense()
    g = g.reshape(-1)
    work = torch.float64 if g.dtype == torch.float64 else torch.float32
    g = g.to(work)
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
