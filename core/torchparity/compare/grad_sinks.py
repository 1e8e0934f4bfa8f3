"""Parameter gradients judged at the module level.

A ``Grad.<module>.<param>`` record holds one parameter's gradient. Where the dump has op-level
records of that module's backward (api, aten), the ops that computed the gradient are judged
themselves and the gradient record is a sink: never scored. In a module-level dump no such op
exists; the module's own backward record computed the gradient from that record's inputs (the
gradient of its output) and from what its forward saved (the module's inputs), so a gradient
judged against those is the only place a fault in a weight-gradient kernel can show.

Three rules make that judgement as calm as the op-level one:

* the gradient inherits its input error from the module's backward records (:func:`inherit`);
* it is a sum over the batch and positions (``m`` = the module's largest backward input over the
  parameter's size): its noise floor grows like ``sqrt(m)``, the rounding of a low-precision
  accumulation (:func:`reduction_allowance`; torch 2.1's bf16 BatchNorm backward on the CPU
  carries 3% on a bias gradient summed over 512 terms). A x2 fault stays far above it; a few-percent
  fault in a weight-gradient kernel is left to the api and aten levels, which judge the kernel;
* a gradient that is ~0 by cancellation next to a larger gradient of the same module (a conv bias
  before BatchNorm) is measured against the largest one (:func:`sibling_factor`), as
  ``cancellation.cancelled_outputs`` does for the outputs of one backward op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import error_model


def judged_sinks(recs: Any, grad_only: np.ndarray) -> np.ndarray:
    """Per record: a parameter-gradient record to be judged here (its module has a module-level
    backward record and no op-level backward record in this (step, rank))."""
    if not grad_only.any() or "level" not in recs or "phase" not in recs:
        return np.zeros(len(recs), dtype=bool)
    level = recs["level"].to_numpy(dtype=object)
    phase = recs["phase"].to_numpy(dtype=object)
    module = recs["module"].astype(str).to_numpy(dtype=object)
    bwd = (phase == "backward") & ~grad_only
    by_module = set(module[bwd & (level == "module")].tolist())
    by_ops = set(module[bwd & (level != "module")].tolist())
    ok = np.fromiter((m in by_module and m not in by_ops for m in module), dtype=bool, count=len(module))
    return grad_only & ok


def _module_backward(recs: Any, sink: np.ndarray) -> np.ndarray:
    """Per record: a module-level backward record (not a gradient sink): what a module's parameter
    gradients were computed from."""
    return (recs["phase"].to_numpy(dtype=object) == "backward") & (recs["level"].to_numpy(dtype=object) == "module") \
        & ~sink


def inherit(recs: Any, sink: np.ndarray, *errors: np.ndarray) -> list[np.ndarray]:
    """Each error array with the ``sink`` records' entries replaced by the largest entry of their
    module's backward module records (the errors those records read)."""
    import pandas as pd

    module = recs["module"].astype(str).to_numpy(dtype=object)
    src = _module_backward(recs, sink)
    out = []
    for e in errors:
        best = pd.Series(np.where(src, e, np.nan)).groupby(module).max()
        got = best.reindex(module).to_numpy(dtype="float64")
        out.append(np.where(sink, got, e))
    return out


def sibling_factor(r: Any, norm: np.ndarray, is_out: Any, sink: Any, module_of: Any) -> np.ndarray:
    """Per row: for the gradient row of a ``sink`` record whose norm is below
    :data:`error_model.CANCEL_RATIO` of the largest gradient of the same module, the ratio of the
    two (its error is measured against the larger one); 1 elsewhere."""
    rid = r["rid"].to_numpy()
    s = sink.reindex(rid).fillna(False).to_numpy(dtype=bool) & is_out.to_numpy()
    if not s.any():
        return np.ones(len(rid))
    mod = module_of.reindex(rid).astype(str).to_numpy(dtype=object)
    import pandas as pd

    big = pd.Series(np.where(s, norm, np.nan)).groupby(mod).max().reindex(mod).to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = norm / big
    small = s & np.isfinite(ratio) & (ratio < error_model.CANCEL_RATIO)
    return np.where(small, ratio, 1.0)


def reduction_allowance(recs: Any, sink: np.ndarray, in_n: np.ndarray, out_n: np.ndarray) -> np.ndarray:
    """Per record: ``sqrt(m)`` for a ``sink`` gradient (``m``: the largest input of its module's
    backward records over the gradient's size, at least 1), 1 elsewhere."""
    import pandas as pd

    module = recs["module"].astype(str).to_numpy(dtype=object)
    src = _module_backward(recs, sink)
    big = pd.Series(np.where(src, in_n, np.nan)).groupby(module).max().reindex(module).to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.nan_to_num(big / out_n, nan=1.0, posinf=1.0)
    return np.where(sink, np.sqrt(np.fmax(m, 1.0)), 1.0)


def sum_allowance(recs: Any, sink: np.ndarray, r: Any, rows: Any, dev: np.ndarray, is_in: Any, is_out: Any,
                  red: np.ndarray) -> np.ndarray:
    """Per record: for a ``sink`` bias gradient, or a per-channel weight gradient (a
    normalisation's scale, 1-d), how much of its module's output-gradient error its sum can carry,
    ``max(1, sqrt(m) * ||g_out|| / ||g||)`` (Cauchy-Schwarz over the ``m`` terms of each channel,
    each a term of the output gradient times a normalised input of magnitude ~1:
    ``||d g|| <= sqrt(m) ||d g_out||``; ``red`` holds ``sqrt(m)``, ``||g_out||`` is the largest
    input norm of the module's backward records, norms of the bench); 1 elsewhere.

    Found by new-user checks: a clean CNN's BatchNorm bias gradient in bf16 against fp32, module
    level, carried 28x its inputs' relative error because its terms nearly cancel (session 15);
    its BatchNorm scale gradient 154x under fp16 autocast (session 16). Weight matrices and
    kernels get no such allowance: ``sqrt(K) ||x|| ||g_out|| / ||g||`` would clear that CNN's
    convolution weight gradient (24x) but hid planted x1.05 backward-matmul faults on 7 of the
    zoo's 11 models."""
    import pandas as pd

    out = np.ones(len(sink))
    if not sink.any() or "bench_norm" not in rows:
        return out
    norm = pd.to_numeric(rows["bench_norm"], errors="coerce").to_numpy(dtype="float64")[dev]
    rid = r["rid"].to_numpy()
    arg = r["arg"].astype(str).to_numpy(dtype=object)
    rec_ids = recs.index.to_numpy()
    shapes = rows["bench_shape"].where(rows["bench_shape"].notna(), rows["device_shape"]).to_numpy(dtype=object)[dev] \
        if "bench_shape" in rows else np.full(int(dev.sum()), None, dtype=object)
    one_d = np.fromiter((isinstance(x, (list, tuple)) and len(x) == 1 for x in shapes), dtype=bool, count=len(shapes))
    is_bias = np.fromiter((a == "bias" or a.endswith(".bias") for a in arg), dtype=bool, count=len(arg))
    is_weight = np.fromiter((a == "weight" or a.endswith(".weight") for a in arg), dtype=bool, count=len(arg))
    channel_row = is_out.to_numpy() & (is_bias | (is_weight & one_d))
    g_norm = pd.Series(np.where(channel_row, norm, np.nan)).groupby(rid).max().reindex(rec_ids).to_numpy(dtype="float64")
    is_channel = sink & np.isfinite(g_norm) & (g_norm > 0)
    if not is_channel.any():
        return out
    module = recs["module"].astype(str).to_numpy(dtype=object)
    src_rec = _module_backward(recs, sink)
    src_rows = pd.Series(src_rec, index=rec_ids).reindex(rid).fillna(False).to_numpy(dtype=bool) & is_in.to_numpy()
    mod_of_row = pd.Series(module, index=rec_ids).reindex(rid).to_numpy(dtype=object)
    in_norm = pd.Series(np.where(src_rows, norm, np.nan)).groupby(mod_of_row).max()
    g_in = in_norm.reindex(module).to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        f = red * g_in / g_norm
    return np.where(is_channel & np.isfinite(f), np.fmax(1.0, f), 1.0)
