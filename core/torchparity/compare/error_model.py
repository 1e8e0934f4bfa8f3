"""The statistics-mode error model: op families and the error channels of the judge.

Rounding in a low-precision run leaves two different traces in the recorded statistics of a tensor
(max, min, mean, norm), so the judge reads them as two *channels*:

* the **aggregate** channel (relative error of the norm): independent rounding errors of the elements average out there (~u/sqrt(n)), while a scale fault
  moves the norm by the full factor: a x1.05 fault is a 0.05 error on a channel whose clean noise is
  a few 1e-3 at most;
* the **extreme** channel (max and min relative to the largest magnitude, and the mean difference
  scaled by norm/sqrt(n), which is ~0 for a gradient and so carries elementwise-size noise): one
  element's error, a few units of roundoff when clean.

Each channel of an op's output is scored against the same channel of its inputs (error carried from
upstream) and the channel's own noise floor for the dtype; the op's score is the larger one.

Op families (:func:`op_families`) change the rule where the plain ratio misleads:

* ``selection`` (topk, sort, argmax, max/min with indices, kthvalue, median, where): a discrete
  choice; when its inputs differ at all, another element may be chosen. It never *introduces*
  error when an input differs above the fp32 noise: the error is propagated, not created.
* ``ill_conditioned`` (div, addcdiv, reciprocal, rsqrt, and every optimizer-phase op: Adam's
  update is ~ lr*g/(|g|+eps) = sign(g) on step 1): a data-dependent denominator turns a tiny
  error of an element near zero into any error. Judged only when their inputs agree (within the
  fp32 noise), like selection ops.
* ``cancelling`` (normalisations and their backward, reductions, weight/bias gradients of matmul
  and convolution): the output can be ~0 by cancellation (a conv bias gradient after BatchNorm),
  so its error relative to its own magnitude is meaningless; only the aggregate channel is scored,
  with the extreme channel left out.
* ``cast``: a cast to a lower precision *is* rounding: never scored.
* everything else (``elementwise``, ``matmul``, ``softmax``...): both channels.

The constants are calibrated on the zoo's clean runs (bench/calibrate_judge.py,
docs/judge-calibration.md).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

#: op-name stems (the second dotted component of ``aten.topk.default``, the last of ``torch.topk``)
SELECTION = frozenset({"topk", "sort", "argsort", "argmax", "argmin", "kthvalue", "median", "nanmedian",
                       "mode", "msort", "where", "max", "min", "cummax", "cummin", "unique", "_unique2",
                       "searchsorted", "bucketize", "masked_select", "nonzero"})
ILL_CONDITIONED = frozenset({"div", "div_", "addcdiv", "addcdiv_", "reciprocal", "reciprocal_", "rsqrt",
                             "rsqrt_", "_foreach_div", "_foreach_div_", "_foreach_addcdiv", "_foreach_addcdiv_",
                             "_foreach_reciprocal", "_foreach_rsqrt", "_fused_adam", "_fused_adam_",
                             "_fused_adamw", "_fused_adamw_", "sign", "sgn", "log", "log_", "atan2"})
CANCELLING = frozenset({"native_layer_norm", "layer_norm", "native_layer_norm_backward", "native_batch_norm",
                        "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "batch_norm",
                        "native_batch_norm_backward", "cudnn_batch_norm", "_batch_norm_impl_index",
                        "native_group_norm", "native_group_norm_backward", "group_norm", "rms_norm",
                        "_fused_rms_norm", "_fused_rms_norm_backward", "convolution_backward", "sum", "mean",
                        "var", "std", "var_mean", "std_mean", "cumsum", "logsumexp", "_log_softmax_backward_data",
                        "_softmax_backward_data", "embedding_dense_backward", "embedding_backward",
                        "mkldnn_rnn_layer_backward", "linalg_vector_norm", "norm", "instance_norm",
                        "sub", "sub_", "rsub"})
CAST = frozenset({"_to_copy", "to", "type_as", "_autocast_to_reduced_precision", "_autocast_to_full_precision",
                  "float", "half", "bfloat16", "double", "type"})
MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "conv1d", "conv2d",
                    "conv3d", "einsum", "addbmm", "addmv", "mv", "dot", "_convolution",
                    # module records (the op is the class name)
                    "Linear", "Conv1d", "Conv2d", "Conv3d", "Conv1D", "NonDynamicallyQuantizableLinear"})

_SPLIT = re.compile(r"[.:]")


def op_stem(op: Any) -> str:
    """``aten.topk.default`` -> ``topk``; ``torch.Tensor.addcdiv_`` -> ``addcdiv_``; ``torch.topk`` ->
    ``topk``; anything else: its text."""
    s = str(op)
    parts = _SPLIT.split(s)
    if parts and parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-1] if parts else s


def family_of(op: Any) -> str:
    """The op family of one op name (see the module docstring)."""
    st = op_stem(op)
    if st in CAST:
        return "cast"
    if st in SELECTION:
        return "selection"
    if st in ILL_CONDITIONED:
        return "ill_conditioned"
    if st in CANCELLING:
        return "cancelling"
    if st in MATMUL:
        return "matmul"
    if "softmax" in st:
        return "softmax"
    return "elementwise"


def _per_name(ops: Any, decide: Any, dtype: Any) -> np.ndarray:
    """``decide(name)`` per op name, vectorised over the distinct names (one decision each)."""
    import pandas as pd

    arr = np.asarray(ops, dtype=object)
    if not len(arr):
        return np.empty(0, dtype=dtype)
    codes, uniq = pd.factorize(pd.Series(arr, dtype=object).astype(str).to_numpy(), use_na_sentinel=False)
    return np.array([decide(u) for u in uniq], dtype=dtype)[codes]


def op_families(ops: Any) -> np.ndarray:
    """:func:`family_of` per op name."""
    return _per_name(ops, family_of, object)


def stems_in(ops: Any, stems: frozenset[str]) -> np.ndarray:
    """Per op name: whether its :func:`op_stem` is one of ``stems``."""
    return _per_name(ops, lambda o: op_stem(o) in stems, bool)


#: the aggregate channel's noise floor, as a fraction of the dtype's elementwise floor
#: (rootcause.NOISE_FLOOR): independent rounding errors average out in the norm and the mean.
#: Calibrated on the zoo (docs/judge-calibration.md).
AGG_FLOOR_FRACTION = 0.25

#: the same for ``matmul``-family outputs: a dot product's output rounding is independent across
#: elements and averages out in the norm. Calibrated on the zoo: clean matmul max score 5.19
#: (bert fp16-api; 6.12 on bf16 from the extreme channel, unchanged), while a x1.05 mm inside an
#: api-level ``linear`` whose bias dominates its output moves the norm 0.72% (lstm/gru
#: fault-fwd-mm-x1.05-api: 2.9 with 0.25, a miss; 14.4 with 0.05).
AGG_FLOOR_FRACTION_MATMUL = 0.05

#: the share of its inputs' largest (elementwise) error that an output's norm may carry without
#: counting as amplified: rounding errors that an op correlates (a bmm against attention weights)
#: do not average out. Calibrated on the zoo (clean max vs x1.05 faults).
AGG_FROM_EXT = 0.25

#: ops raising each element to a power above 1: the norm of their output weighs the largest elements
#: most, so an elementwise input error reaches it up to twice (x**2) where a plain op passes a share
POWER_STEMS = frozenset({"pow", "square"})

#: an output of a backward op whose norm is below this fraction of the op's largest output is ~0
#: by cancellation (a bias gradient a softmax or a BatchNorm makes vanish): judged against that
#: largest output, not against itself
CANCEL_RATIO = 1e-2


def stat_channels(rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the aggregate and the extreme channel of the statistics error (relative; NaN where
    unknown), computed like ``metrics.stat_metrics``'s ``stat_error`` (whose maximum they are).

    Rows whose ``error`` is not that statistics error (tensor mode, NaN/Inf mismatch: their error
    is a full-tensor metric or infinite) get ``NaN`` on the aggregate channel and their ``error``
    on the extreme channel, so they are judged exactly as one error with the elementwise floor.
    """
    from .metrics import _rel

    n = len(rows)
    err = rows["error"].to_numpy(dtype="float64")
    need = ("device_norm", "bench_norm", "device_max", "bench_max", "device_min", "bench_min",
            "device_mean", "bench_mean")
    if not n or any(c not in rows for c in need):
        return np.full(n, np.nan), err.copy()
    d = {s: rows[f"device_{s}"].to_numpy(dtype="float64") for s in ("max", "min", "mean", "norm")}
    b = {s: rows[f"bench_{s}"].to_numpy(dtype="float64") for s in ("max", "min", "mean", "norm")}
    shapes = rows["bench_shape"].where(rows["bench_shape"].notna(), rows["device_shape"]) if "bench_shape" in rows else None
    from .metrics import numel

    nel = numel(shapes.tolist()) if shapes is not None else np.full(n, np.nan)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        fb = {s: np.isfinite(d[s]) & np.isfinite(b[s]) for s in d}
        scale = np.fmax(np.where(fb["max"], np.abs(b["max"]), np.nan), np.where(fb["min"], np.abs(b["min"]), np.nan))
        bn = np.where(fb["norm"], np.abs(b["norm"]), np.nan)
        norm_e = np.where(fb["norm"], _rel(d["norm"] - b["norm"], bn), np.nan)
        sq = np.sqrt(np.where(np.isnan(nel), 1.0, nel))
        mean_scale = np.where(fb["norm"], bn, scale * sq)
        mean_e = np.where(fb["mean"], _rel(np.abs(d["mean"] - b["mean"]) * sq, mean_scale), np.nan)
        ext = np.fmax(np.where(fb["max"], np.abs(d["max"] - b["max"]), np.nan),
                      np.where(fb["min"], np.abs(d["min"] - b["min"]), np.nan))
        ext_e = _rel(ext, scale)
        # the mean of a tensor whose mean is ~0 (a gradient) carries elementwise-size noise: it
        # goes with the extremes; the norm alone is the aggregate channel
        agg = norm_e
        ext_e = np.fmax(ext_e, mean_e)
        both = np.fmax(agg, ext_e)
    # the channels only where they explain the row's error (statistics mode, finite, paired)
    with np.errstate(invalid="ignore"):
        own = np.isfinite(err) & (np.abs(both - err) <= 1e-12 * np.fmax(np.abs(err), 1e-300))
    zero = err == 0
    agg = np.where(own, agg, np.where(zero, 0.0, np.nan))
    ext_e = np.where(own, np.where(np.isnan(ext_e), agg, ext_e), err)
    return agg, ext_e


_INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"})


def integer_rows(rows: Any) -> np.ndarray:
    """Per row: the tensor is of an integer (or bool) dtype on the device side (an index, a mask)."""
    if "device_dtype" not in rows:
        return np.zeros(len(rows), dtype=bool)
    import pandas as pd

    codes, uniq = pd.factorize(rows["device_dtype"].to_numpy(dtype=object), use_na_sentinel=False)
    vals = np.array([isinstance(u, str) and u in _INTEGER_DTYPES for u in uniq] + [False], dtype=bool)
    return vals[codes] if len(codes) else np.zeros(0, dtype=bool)


def cancel_scale(rows: Any) -> np.ndarray:
    """Per row, the bench norm of the tensor (the device's where the bench has no such row; NaN
    where unknown): the magnitude a ``cancelling`` op's output error is measured against when it
    is larger than the output's own norm."""
    if "bench_norm" not in rows:
        return np.full(len(rows), np.nan)
    norm = np.abs(rows["bench_norm"].to_numpy(dtype="float64"))
    if "device_norm" in rows:  # a row of one side only (a compiled graph fused its value away): its own norm
        norm = np.where(np.isnan(norm), np.abs(rows["device_norm"].to_numpy(dtype="float64")), norm)
    return norm


def peak_factor(rows: Any) -> np.ndarray:
    """Per row, ``max|x| * sqrt(numel) / norm`` of the bench tensor (>= 1; 1 where unknown).

    The extreme channel is one element's error relative to the largest magnitude; rounding that
    arrived from upstream (a matmul's accumulation) is that size in *absolute* terms on every
    element, small ones included. The norm of the whole error vector, relative to the tensor's
    norm, is then the extreme error times this factor: what a reduction (a sum over a dimension,
    a normalisation's backward) adds up, while the norm of its input barely moves."""
    need = ("bench_max", "bench_min", "bench_norm")
    if not len(rows) or any(c not in rows for c in need):
        return np.ones(len(rows))
    from .metrics import numel

    shapes = rows["bench_shape"].where(rows["bench_shape"].notna(), rows["device_shape"]) if "bench_shape" in rows else None
    if shapes is None:
        return np.ones(len(rows))
    nel = numel(shapes.tolist())
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = np.fmax(np.abs(rows["bench_max"].to_numpy(dtype="float64")),
                        np.abs(rows["bench_min"].to_numpy(dtype="float64")))
        f = scale * np.sqrt(nel) / np.abs(rows["bench_norm"].to_numpy(dtype="float64"))
    return np.where(np.isfinite(f) & (f > 1.0), f, 1.0)
