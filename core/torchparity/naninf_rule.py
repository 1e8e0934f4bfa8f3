"""The NaN/Inf rule users mean, shared by the online tracker and ``torchparity overflow``.

A non-finite value that is created and absorbed (a mask's ``-inf`` consumed by a softmax,
``log(0)`` clamped or selected away) is information, not a finding. A finding is a *creation
site* (an op that turned finite inputs into NaN/Inf, or wrote a NaN/Inf scalar) whose non-finite
values reach a *sink*: the loss or other code outside any module, a gradient (every backward
op), a parameter or optimizer state (every optimizer op), or the model's output. Every site of a
step is listed, the harmful ones first, in op order.

Pure functions on plain values, no torch import: both the online tracker
(:mod:`torchparity.online`) and the offline overflow checker (``checkers/overflow``) apply them.
"""

from __future__ import annotations

import math
from typing import Any

#: phases whose every op is a sink: gradients, parameters and optimizer state
SINK_PHASES = frozenset({"backward", "optimizer"})

#: a GradScaler's check of the gradients (its inputs: the scaled gradients; ``found_inf``; ``1/S``)
AMP_UNSCALE_OP = "_amp_foreach_non_finite_check_and_unscale_"
#: a GradScaler's scale update (argument 2: ``found_inf``)
AMP_UPDATE_OP = "_amp_update_scale_"

HARMFUL, ABSORBED, ENTERED = "harmful", "absorbed", "entered"

ABSORBED_REASON = ("absorbed: its NaN/Inf never reached the loss, a gradient, a parameter, optimizer state or "
                   "the model's output (information, not a finding)")


def is_sink(phase: str, outside_any_module: bool) -> bool:
    """Whether a non-finite output of an op in ``phase`` is harmful wherever it came from: every
    backward and optimizer op, and forward ops outside any module (the loss, the user's code)."""
    return phase in SINK_PHASES or (phase == "forward" and outside_any_module)


def creates_nonfinite_scalar(value: Any) -> bool:
    """A scalar argument that *creates* a non-finite value where the op writes it: NaN
    (``x * nan``, ``fill_(nan)``, ``out[..., 3] = nan``). An infinite scalar is no creation by
    itself: ``masked_fill(mask, -inf)`` is how masks are written (absorbed or not, the sink
    rule decides)."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return value.strip().lower() == "nan"
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def site_order(status: str, record_order: int) -> tuple[int, int]:
    """Sort key of creation sites: harmful first, then entered, then absorbed; op order within."""
    return ({HARMFUL: 0, ENTERED: 1}.get(status, 2), record_order)


def gradscaler_found_inf(base: Any, io: Any, arg: Any, maximum: Any, nonfinite: Any) -> Any:
    """Per record row (numpy arrays: op base name, ``io``, argument, the tensor's max, whether it
    holds NaN/Inf): does it show that a GradScaler found Inf/NaN gradients, and so skips the
    optimizer step (its scaled backward overflowed, by design)? The unscale op read a non-finite
    gradient, or the update op got ``found_inf > 0``. One rule for ``torchparity overflow``, the
    compare and the tracker's readers of dumps."""
    import numpy as np

    inp = io == "input"
    with np.errstate(invalid="ignore"):
        update = (base == AMP_UPDATE_OP) & inp & np.isin(arg, ["2", "found_inf"]) & (maximum > 0)
    return ((base == AMP_UNSCALE_OP) & inp & nonfinite) | update
