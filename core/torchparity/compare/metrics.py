"""Per-tensor metrics, in float64.

* :func:`stat_metrics`: vectorised over all rows from the recorded statistics (every mode);
  also the scalar ``stat_error`` used by root-cause analysis when tensors are not saved.
* :func:`tensor_metrics`: full-tensor metrics for one pair (tensor mode), defined for 0-d,
  one-element, all-zero and empty tensors without warnings or NaN.

Error conventions: relative differences are ``|d - b| / |b|``; where ``b == 0`` they are 0 when
``d == 0`` too and ``inf`` otherwise (never an epsilon that hides a difference). NaN/Inf that sit
at the same positions on both sides are excluded from the metrics; NaN/Inf that do not coincide
set ``nonfinite_mismatch`` and an infinite error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

STATS = ("max", "min", "mean", "norm")
TENSOR_METRICS = ("cosine", "max_abs_err", "max_rel_err", "mean_rel_err", "rmse", "euc_dist",
                  "one_thousandth_ratio", "five_thousandth_ratio", "worst_index", "rel_l2")


def _rel(diff: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|diff| / |ref| with the zero conventions above (vectorised, no warnings)."""
    ad = np.abs(diff)
    ar = np.abs(ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(ar > 0, ad / np.where(ar > 0, ar, 1.0), np.where(ad > 0, np.inf, 0.0))
    return np.where(np.isnan(diff) | np.isnan(ref), np.nan, out)


def numel(shapes: Any) -> np.ndarray:
    """Number of elements per shape tuple (NaN for missing shapes)."""
    import pandas as pd

    arr = pd.Series(list(shapes), dtype=object).to_numpy()
    if not len(arr):
        return np.empty(0, dtype="float64")
    codes, uniq = factorize_shapes(arr)  # one product per distinct shape
    vals = np.array([float(math.prod(s)) if isinstance(s, tuple) else np.nan for s in uniq] + [np.nan],
                    dtype="float64")
    return vals[codes]


def factorize_shapes(arr: Any) -> tuple[np.ndarray, Any]:
    """``pd.factorize`` of an object array of shapes; anything but a tuple (an unhashable list)
    counts as a missing shape."""
    import pandas as pd

    try:
        return pd.factorize(arr)
    except TypeError:
        clean = np.empty(len(arr), dtype=object)
        clean[:] = [s if isinstance(s, tuple) else None for s in arr]
        return pd.factorize(clean)


def stat_metrics(d: dict[str, np.ndarray], b: dict[str, np.ndarray], n: np.ndarray) -> dict[str, np.ndarray]:
    """Statistic differences and the statistics-based error estimate.

    :param d: device ``max/min/mean/norm/nan/inf`` arrays; :param b: bench arrays; :param n: numel.
    """
    out: dict[str, np.ndarray] = {}
    fin: dict[str, np.ndarray] = {}
    for s in STATS:
        dv, bv = d[s], b[s]
        both_nonfinite_same = (~np.isfinite(dv)) & (~np.isfinite(bv)) & ((dv == bv) | (np.isnan(dv) & np.isnan(bv)))
        with np.errstate(invalid="ignore"):
            diff = np.where(both_nonfinite_same, 0.0, dv - bv)
        out[f"{s}_diff"] = diff
        out[f"{s}_rel_diff"] = np.where(both_nonfinite_same, 0.0, _rel(diff, bv))
        fin[s] = np.isfinite(dv) == np.isfinite(bv)
    counts_known = ~(np.isnan(d["nan"]) | np.isnan(b["nan"]))
    with np.errstate(invalid="ignore"):
        count_mismatch = counts_known & ((d["nan"] != b["nan"]) | (np.nan_to_num(d["inf"], nan=0) != np.nan_to_num(b["inf"], nan=0)))
    # a side "has statistics" when its NaN count is known or any statistic was recorded (an
    # all-NaN tensor has NaN max/min/norm but a known NaN count)
    d_has = ~np.isnan(d["nan"]) | ~(np.isnan(d["max"]) & np.isnan(d["min"]) & np.isnan(d["norm"]))
    b_has = ~np.isnan(b["nan"]) | ~(np.isnan(b["max"]) & np.isnan(b["min"]) & np.isnan(b["norm"]))
    has_stats = d_has & b_has
    ext_mismatch = ~(fin["max"] & fin["min"])
    mismatch = has_stats & (count_mismatch | (~counts_known & ext_mismatch))
    out["nonfinite_mismatch"] = mismatch

    # error estimate: relative norm difference, mean difference scaled by norm/sqrt(n), and the
    # extremes relative to the tensor's largest magnitude. Never a relative error of a mean.
    # Only statistics that are finite on both sides take part (a masked -inf makes the norm and
    # the mean infinite but leaves the max informative); when none is, the error is unknown
    # (NaN) unless every statistic is identical.
    fb = {s: np.isfinite(d[s]) & np.isfinite(b[s]) for s in STATS}
    absb = [np.where(fb[s], np.abs(b[s]), np.nan) for s in ("max", "min")]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = np.fmax(absb[0], absb[1])
        bn = np.where(fb["norm"], np.abs(b["norm"]), np.nan)
        norm_e = np.where(fb["norm"], _rel(out["norm_diff"], bn), np.nan)
        mean_scale = np.where(fb["norm"], bn, scale * np.sqrt(np.where(np.isnan(n), 1.0, n)))
        mean_e = np.where(fb["mean"], _rel(np.abs(out["mean_diff"]) * np.sqrt(np.where(np.isnan(n), 1.0, n)), mean_scale), np.nan)
        ext = np.fmax(np.where(fb["max"], np.abs(out["max_diff"]), np.nan), np.where(fb["min"], np.abs(out["min_diff"]), np.nan))
        ext_e = _rel(ext, scale)
        err = np.fmax(np.fmax(norm_e, mean_e), ext_e)
    all_same = np.ones(len(err), dtype=bool)
    for s in STATS:
        all_same &= (out[f"{s}_diff"] == 0) | (np.isnan(d[s]) & np.isnan(b[s]))
    err = np.where(np.isnan(err) & all_same, 0.0, err)
    err = np.where(mismatch, np.inf, err)
    out["stat_error"] = np.where(has_stats, err, np.nan)
    return out


def put_tensor_metrics(cols: dict[str, np.ndarray], nfm: np.ndarray, err: np.ndarray, i: int,
                       m: dict[str, Any], matched: bool) -> None:
    """Store one pair's :func:`tensor_metrics` ``m`` at row ``i`` of the metric columns, the
    NaN/Inf-mismatch flags and (for a paired row) the error, in place."""
    for c in TENSOR_METRICS:
        cols[c][i] = m[c]
    nfm[i] = nfm[i] or m["nonfinite_mismatch"]
    if matched:
        err[i] = m["rel_l2"]


def tensor_metric_columns(rows: Any, cols: dict[str, np.ndarray]) -> None:
    """Write the metric columns filled by :func:`put_tensor_metrics` back into ``rows``."""
    for c in TENSOR_METRICS:
        rows[c] = cols[c] if c == "worst_index" else cols[c].astype("float64")


def _to_f64(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.to(torch.float64).cpu().reshape(-1).numpy()


def tensor_metrics(dev: Any, bench: Any) -> dict[str, Any]:
    """Full-tensor metrics of one pair of torch tensors (shapes must have equal numel)."""
    shape = tuple(dev.shape)
    d, b = _to_f64(dev), _to_f64(bench)
    if d.size != b.size:
        raise ValueError(f"element counts differ ({d.size} vs {b.size})")
    nan_d, nan_b = np.isnan(d), np.isnan(b)
    pinf_d, pinf_b = np.isposinf(d), np.isposinf(b)
    ninf_d, ninf_b = np.isneginf(d), np.isneginf(b)
    mismatch = bool(np.any(nan_d != nan_b) or np.any(pinf_d != pinf_b) or np.any(ninf_d != ninf_b))
    if mismatch:
        idx = int(np.argmax((nan_d != nan_b) | (pinf_d != pinf_b) | (ninf_d != ninf_b)))
        return {"cosine": 0.0, "max_abs_err": math.inf, "max_rel_err": math.inf, "mean_rel_err": math.inf,
                "rmse": math.inf, "euc_dist": math.inf, "one_thousandth_ratio": 0.0, "five_thousandth_ratio": 0.0,
                "worst_index": _unravel(idx, shape), "rel_l2": math.inf, "nonfinite_mismatch": True}
    bad = nan_d | pinf_d | ninf_d  # coinciding non-finite values: left out
    worst_full = None
    if bad.any():
        keep = np.flatnonzero(~bad)
        d, b = d[keep], b[keep]
    else:
        keep = None
    n = d.size
    if n == 0:
        return {"cosine": 1.0, "max_abs_err": 0.0, "max_rel_err": 0.0, "mean_rel_err": 0.0, "rmse": 0.0,
                "euc_dist": 0.0, "one_thousandth_ratio": 1.0, "five_thousandth_ratio": 1.0,
                "worst_index": None, "rel_l2": 0.0, "nonfinite_mismatch": False}
    diff = d - b
    ad = np.abs(diff)
    rel = _rel(diff, b)
    nd, nb = float(np.linalg.norm(d)), float(np.linalg.norm(b))
    euc = float(np.linalg.norm(diff))
    if nd == 0.0 and nb == 0.0:
        cos = 1.0
    elif nd == 0.0 or nb == 0.0:
        cos = 0.0
    else:
        cos = float(np.clip(np.dot(d, b) / (nd * nb), -1.0, 1.0))
    finite_rel = rel[np.isfinite(rel)]
    worst = int(np.argmax(ad))
    worst_full = int(keep[worst]) if keep is not None else worst
    return {
        "cosine": cos,
        "max_abs_err": float(ad.max()),
        "max_rel_err": float(rel.max()),
        "mean_rel_err": float(finite_rel.mean()) if finite_rel.size else (0.0 if not np.isinf(rel).any() else math.inf),
        "rmse": float(math.sqrt(float(np.mean(diff * diff)))),
        "euc_dist": euc,
        "one_thousandth_ratio": float(np.mean(rel <= 1e-3)),
        "five_thousandth_ratio": float(np.mean(rel <= 5e-3)),
        "worst_index": _unravel(worst_full, shape),
        "rel_l2": (euc / nb) if nb > 0 else (0.0 if euc == 0 else math.inf),
        "nonfinite_mismatch": False,
    }


def _unravel(i: int, shape: tuple[int, ...]) -> list[int] | None:
    if not shape:
        return []
    try:
        return [int(x) for x in np.unravel_index(i, shape)]
    except ValueError:
        return None


# ---- sentinel constants (finfo(dtype).min / .max) ----------------------------------------------
#: the largest finite value of each floating dtype (``torch.finfo(dtype).max``)
FINFO_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
#: machine epsilon (one unit in the last place at 1.0) of each floating dtype
FINFO_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52,
             "float8_e4m3fn": 2.0 ** -3, "float8_e5m2": 2.0 ** -2}


def dtype_limits(dtypes: Any) -> np.ndarray:
    """``finfo(dtype).max`` per dtype name (NaN for integer, bool and unknown dtypes)."""
    import pandas as pd

    arr = pd.Series(list(dtypes), dtype=object).to_numpy()
    if not len(arr):
        return np.empty(0, dtype="float64")
    codes, uniq = pd.factorize(arr)
    return np.array([FINFO_MAX.get(u, np.nan) if isinstance(u, str) else np.nan for u in uniq] + [np.nan],
                    dtype="float64")[codes]


def sentinel_extremes(d: dict[str, np.ndarray], b: dict[str, np.ndarray], d_dtype: Any,
                      b_dtype: Any) -> dict[str, np.ndarray]:
    """Per extreme (``max``, ``min``): the device's statistic is a saturated sentinel
    (``+-finfo(dtype).max`` of its dtype or of a narrower float dtype, as autocast's fp16 mask in a
    float32 tensor) and the bench's is a same-signed sentinel too.

    Masks are built from ``finfo(dtype).min`` (``where(mask, 0, finfo.min)``): the constant is
    -3.39e38 in bfloat16 and -3.40e38 in float32, the same value by meaning. Such a pair is not a
    difference, not an overflow, and carries no information about rounding; a device at its
    dtype's limit where the bench holds an ordinary value stays a genuine saturation."""
    dl, bl = dtype_limits(d_dtype), dtype_limits(b_dtype)
    out: dict[str, np.ndarray] = {}
    with np.errstate(invalid="ignore"):
        for s in ("max", "min"):
            dv, bv = d[s], b[s]
            ed, eb = _is_sentinel(dv, dl), _is_sentinel(bv, bl)
            # one side exactly at a sentinel, the other at one or near a narrower one (a bias added
            # to autocast's -65504 in float32: -65506.5, where the fp32 run's -3.4e38 absorbs it;
            # a narrower dtype's sentinel beside a wider one's: never a value near the same one,
            # which may be a genuine overflow)
            pair = (ed & eb) | (ed & _near_sentinel(bv, np.abs(dv))) | (eb & _near_sentinel(dv, np.abs(bv)))
            out[s] = ~np.isnan(dl) & ~np.isnan(bl) & pair & (np.sign(dv) == np.sign(bv))
    return out


#: the sentinel magnitudes a mask may hold: finfo(t).max of the dtypes a model builds masks in.
#: An fp16-autocast run keeps ``finfo(float16).min`` = -65504 in a float32 mask where its fp32
#: reference holds -3.40e38: the same constant by meaning.
_SENTINELS = np.array(sorted({FINFO_MAX[k] for k in ("float16", "bfloat16", "float32")}))


def _near_sentinel(v: np.ndarray, below: np.ndarray) -> np.ndarray:
    """``|v|`` lies between half a sentinel and twice it (a sentinel plus an ordinary value),
    for a sentinel strictly smaller than ``below`` (the other side's exact sentinel)."""
    av = np.abs(v)
    near = np.zeros(np.shape(av), dtype=bool)
    for sv in _SENTINELS:
        near |= (av >= sv / 2) & (av <= 2 * sv) & (sv < below)
    return near


def _is_sentinel(v: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """``|v|`` is the finfo max of its own dtype (``limit``) or of a narrower float dtype."""
    av = np.abs(v)
    return (av == limit) | (np.isin(av, _SENTINELS) & (av <= limit))


def without_sentinels(d: dict[str, np.ndarray], b: dict[str, np.ndarray],
                      sentinel: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Copies of the statistics with what a sentinel pair dominates left out (NaN on both sides):
    the sentinel extremes themselves, and the mean and norm of such a tensor (a sum of +-3.4e38
    says nothing about the tensor's other values). The error is then judged on the statistics
    that remain (the other extreme), or is 0 when nothing remains (the two hold the same
    sentinel), never infinite."""
    any_s = sentinel["max"] | sentinel["min"]
    if not any_s.any():
        return d, b
    d2, b2 = dict(d), dict(b)
    for s, m in (("max", sentinel["max"]), ("min", sentinel["min"]), ("mean", any_s), ("norm", any_s)):
        d2[s] = np.where(m, np.nan, d[s])
        b2[s] = np.where(m, np.nan, b[s])
    return d2, b2
