"""What "the divergence is removed" means for a bisect.

The outputs of the chosen step (every floating tensor or number the entry function returned for
it, matched by position) are compared with the reference's. The error of one output is the
compare's *aggregate channel*: the relative error of the whole tensor,
``||target - reference||_2 / ||reference||_2`` (independent rounding errors average out there,
while an op that loses precision moves it by its full size); the run's error is the largest over
the outputs. A NaN/Inf on one side only, or a shape mismatch, is an infinite error.

The run **diverges** when that error exceeds the tolerance, and a promotion **removes** the
divergence when the promoted run's error is within it. The default tolerance is the compare's noise
floor for the target's dtype (:data:`torchparity.compare.rootcause.NOISE_FLOOR`: 0.01 for
bfloat16, 0.002 for float16), the largest relative error rounding alone produces; ``tolerance=``
overrides it.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import UsageError


def flatten_outputs(out: Any) -> list[Any]:
    """Floating tensors and numbers of an output, in a stable order (mappings by key)."""
    import torch

    found: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() or x.is_complex():
                found.append(x.detach().to("cpu", torch.float64))
        elif isinstance(x, bool):
            return
        elif isinstance(x, (int, float)):
            found.append(torch.tensor(float(x), dtype=torch.float64))
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "to_tuple"):  # transformers ModelOutput
            walk(x.to_tuple())

    walk(out)
    return found


def output_error(target: list[Any], reference: list[Any]) -> float:
    """The largest relative L2 error over the outputs (inf when one side is not finite or shapes differ)."""
    import torch

    if len(target) != len(reference):
        raise UsageError(f"bisect: the target run returned {len(target)} floating output(s), the reference "
                         f"{len(reference)}; the entry function must return the same structure in both")
    if not reference:
        raise UsageError("bisect: the entry function returned no floating tensor or number to compare; "
                         "return the loss, the logits, or a list of them per step")
    worst = 0.0
    for t, r in zip(target, reference):
        if t.shape != r.shape:
            return math.inf
        tf, rf = torch.isfinite(t), torch.isfinite(r)
        if not torch.equal(tf, rf) or not torch.equal(t[~tf], r[~rf]):
            return math.inf
        t, r = t[tf], r[rf]
        num = float(torch.linalg.vector_norm(t - r))
        den = float(torch.linalg.vector_norm(r))
        err = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        worst = max(worst, err)
    return worst


def default_tolerance(dtype_name: str | None) -> float:
    """The compare's noise floor for ``dtype_name`` (bfloat16 0.01, float16 0.002)."""
    from ..compare.rootcause import NOISE_FLOOR

    return float(NOISE_FLOOR.get(dtype_name or "bfloat16", NOISE_FLOOR["bfloat16"]))
