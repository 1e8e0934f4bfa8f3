"""Outputs that are ~0 by cancellation (a bias gradient under softmax or before BatchNorm): their
error is measured against a larger magnitude of the same op, not their own
(docs/judge-calibration.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import error_model


def cancelled_outputs(r: Any, norm: np.ndarray, is_out: Any, backward: Any) -> np.ndarray:
    """Per row, the factor that measures an output of a backward record against the record's
    largest output when it is below :data:`error_model.CANCEL_RATIO` of it (a bias gradient that is
    ~0 by cancellation: a key-projection bias under softmax, a conv bias before BatchNorm, beside
    the weight and input gradients of the same op); 1 elsewhere."""
    out = is_out.to_numpy()
    rid = r["rid"].to_numpy()
    b = backward.reindex(rid).fillna(False).to_numpy(dtype=bool) & out
    if not b.any():
        return np.ones(len(rid))
    big = r.assign(n=np.where(b, norm, np.nan)).groupby("rid")["n"].max().reindex(rid).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = norm / big
    small = b & np.isfinite(ratio) & (ratio < error_model.CANCEL_RATIO)
    return np.where(small, ratio, 1.0)


def against_inputs(r: Any, agg: np.ndarray, norm: np.ndarray, is_in: Any, is_out: Any,
                    cancelling: Any) -> np.ndarray:
    """The aggregate error of the outputs of ``cancelling`` records measured against the largest
    norm that went into the record when that is larger than the output's own norm (an output ~0
    by cancellation, like a conv bias gradient after BatchNorm, is judged against its inputs)."""
    rid = r["rid"].to_numpy()
    in_norm = (r.assign(n=np.where(is_in.to_numpy(), norm, np.nan)).groupby("rid")["n"].max())
    canc = cancelling.reindex(rid).fillna(False).to_numpy(dtype=bool) & is_out.to_numpy()
    if not canc.any():
        return agg
    ref = in_norm.reindex(rid).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(canc & (ref > norm), norm / ref, 1.0)
    return np.where(canc & np.isfinite(factor), agg * factor, agg)
