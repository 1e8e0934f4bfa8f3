"""Compare rows of one (step, rank): paired tensor rows -> one row per tensor with statistics,
checksum and full-tensor metrics (the columns documented in :mod:`torchparity.results`), and the
checks that refuse dumps of different computations."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ..errors import DumpError
from . import matching, metrics

log = logging.getLogger("torchparity")


#: below this fraction of paired records (of the smaller side) the dumps are not comparable
MIN_PAIRED_FRACTION = 0.25


def check_same_computation(pairs: Any, step: int, rank: int) -> None:
    """Refuse to compare dumps of different computations (a different model, level or filters)."""
    m = pairs["match"].to_numpy()
    n_d = int((pairs["dev_rid"] >= 0).sum())
    n_b = int((pairs["bench_rid"] >= 0).sum())
    paired = int((m != "unmatched").sum())
    smaller = min(n_d, n_b)
    if smaller >= 4 and paired < MIN_PAIRED_FRACTION * smaller:
        raise DumpError(
            f"step{step}/rank{rank}: only {paired} of {n_d} device and {n_b} bench records pair up; these dumps "
            f"do not record the same computation (different model, dump level or filters?) - dump both runs the same way")


#: below this fraction of paired records (both inside a module) whose module paths agree, the dumps
#: are of different models (paths agree when equal or when one ends with the other: a DDP/FSDP or
#: torch.compile wrapper adds a prefix)
MIN_SAME_MODULE_FRACTION = 0.1


def check_same_modules(pairs: Any, d: Any, b: Any, step: int, rank: int, mapping: Any) -> None:
    """Refuse dumps of different models whose op sequences happen to pair up (a BERT and a
    Llama both run matmuls, adds and softmaxes): paired records almost never share a module path.
    Skipped with a layer mapping (the user says the names differ)."""
    if mapping:
        return
    p = pairs[(pairs["dev_rid"] >= 0) & (pairs["bench_rid"] >= 0) & (pairs["match"] != "unmatched")]
    if len(p) < 20 or "module" not in d or "module" not in b:
        return
    dm = d.drop_duplicates("record_id").set_index("record_id")["module"]
    bm = b.drop_duplicates("record_id").set_index("record_id")["module"]
    md = dm.reindex(p["dev_rid"].to_numpy()).fillna("").astype(str).to_numpy(dtype=object)
    mb = bm.reindex(p["bench_rid"].to_numpy()).fillna("").astype(str).to_numpy(dtype=object)
    known = (md != "") & (mb != "")
    n = int(known.sum())
    if n < 20:
        return
    same = sum(1 for x, y in zip(md[known], mb[known]) if _same_path(x, y))
    if same < MIN_SAME_MODULE_FRACTION * n:
        first = int(np.flatnonzero(known)[0])
        raise DumpError(
            f"step{step}/rank{rank}: the records pair up by op, but only {same} of {n} pairs share a module path "
            f"(first: device '{md[first]}', bench '{mb[first]}'); these dumps are of different models - compare "
            f"runs of the same model, or pass --layer-mapping if the same model names its modules differently")


#: path segments that wrappers insert (activation checkpointing, FSDP1, torch.compile)
_WRAPPER_SEGMENTS = frozenset({"_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod",
                               "_offload_wrapped_module"})


def _same_path(x: str, y: str) -> bool:
    """Module paths of the same module in two runs: equal once wrapper segments are dropped, or one
    ending with the other (a DDP ``module.`` prefix)."""
    if x == y:
        return True
    x = ".".join(p for p in x.split(".") if p not in _WRAPPER_SEGMENTS)
    y = ".".join(p for p in y.split(".") if p not in _WRAPPER_SEGMENTS)
    return x == y or x.endswith("." + y) or y.endswith("." + x)


def check_same_shapes(both: Any, step: int, rank: int) -> None:
    """Refuse pairs of dumps whose paired records mostly disagree on tensor shapes (another model
    size, another batch): every row would be an error and the root cause meaningless."""
    ds, bs = both["d_shape"].to_numpy(dtype=object), both["b_shape"].to_numpy(dtype=object)
    rid = both["d_record_id"].to_numpy()
    if not len(ds):
        return
    import pandas as pd

    # one type check per distinct shape; equal shapes share a code
    codes, uniq = metrics.factorize_shapes(pd.Series(list(ds) + list(bs), dtype=object).to_numpy())
    is_tuple = np.array([isinstance(u, tuple) for u in uniq] + [False], dtype=bool)
    cd, cb = codes[:len(ds)], codes[len(ds):]
    known = is_tuple[cd] & is_tuple[cb] & _measured(both, "d") & _measured(both, "b")
    if not known.any():
        return
    differs = known & (cd != cb)
    recs = np.unique(rid[known])
    bad = np.unique(rid[known & differs])
    if len(recs) >= 4 and len(bad) > 0.5 * len(recs):
        first = int(np.flatnonzero(known & differs)[0])
        raise DumpError(
            f"step{step}/rank{rank}: {len(bad)} of {len(recs)} paired records have different tensor shapes "
            f"(first: {both['d_name'].iat[first]} {ds[first]} vs {both['b_name'].iat[first]} {bs[first]}); these "
            f"dumps are not of the same model and input - check the model size, batch and sequence length")


def _measured(both: Any, side: str) -> np.ndarray:
    """Per paired row: that side's tensor was measured (a statistic or a checksum). A tensor the
    capture described without measuring (uninitialised memory, a kernel workspace whose size
    depends on the kernel and the dtype) says nothing about the computation, not even by its shape."""
    m = np.zeros(len(both), dtype=bool)
    for s in metrics.STATS + ("nan",):
        c = f"{side}_{s}"
        if c in both.columns:
            m |= both[c].notna().to_numpy()
    if f"{side}_md5" in both.columns:
        m |= both[f"{side}_md5"].notna().to_numpy()
    return m


def _col(both: Any, name: str) -> Any:
    d, b = both[f"d_{name}"], both[f"b_{name}"]
    na = d.isna()
    return d.where(~na, b) if na.any() else d


def _join_dot(a: Any, b: Any) -> Any:
    """``a + "." + b`` for two string columns of few distinct values: computed once per distinct
    pair and repeated (same values and dtype as the element-wise concatenation)."""
    if not len(a):
        return a + "." + b
    ca, ua = pd_factorize(a)
    cb, ub = pd_factorize(b)
    key = ca.astype(np.int64) * (len(ub) + 1) + cb
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    head = a.iloc[first].reset_index(drop=True) + "." + b.iloc[first].reset_index(drop=True)
    return type(a)(head.array.take(inv.reshape(-1)), index=a.index)


def pd_factorize(x: Any) -> tuple[np.ndarray, Any]:
    import pandas as pd

    return pd.factorize(x)


def build_rows(both: Any, step: int, rank: int) -> Any:
    import pandas as pd

    n = len(both)
    io = matching.text_column(_col(both, "io"))
    arg = matching.text_column(_col(both, "arg"))
    rid = both["d_record_id"].to_numpy()
    brid = both["b_record_id"].fillna(-1).astype("int64").to_numpy()
    order = _order(rid, brid, both)
    rows = pd.DataFrame({
        "device_name": both["d_name"], "bench_name": both["b_name"], "tensor": _join_dot(io, arg),
        "op": _col(both, "op"), "module": _col(both, "module"), "phase": _col(both, "phase"),
        "level": _col(both, "level"), "step": step, "rank": rank, "order": order, "io": io, "arg": arg,
        "kind": _col(both, "kind"), "match": both["match"].to_numpy(),
        "device_dtype": both["d_dtype"], "bench_dtype": both["b_dtype"],
        "device_shape": both["d_shape"], "bench_shape": both["b_shape"],
        "device_requires_grad": both["d_requires_grad"], "bench_requires_grad": both["b_requires_grad"],
        "d_record_id": rid, "bench_record_id": brid, "producer": both["d_producer"], "d_stack": both["d_stack"],
        "d_fwd": both["d_fwd"],
    })
    for c in ("cosine", "max_abs_err", "max_rel_err", "mean_rel_err", "rmse", "euc_dist",
              "one_thousandth_ratio", "five_thousandth_ratio", "rel_l2"):
        rows[c] = np.nan
    rows["worst_index"] = None
    dstat = {s: both[f"d_{s}"].to_numpy(dtype="float64") for s in metrics.STATS + ("nan", "inf")}
    bstat = {s: both[f"b_{s}"].to_numpy(dtype="float64") for s in metrics.STATS + ("nan", "inf")}
    for s in metrics.STATS:
        rows[f"device_{s}"] = dstat[s]
        rows[f"bench_{s}"] = bstat[s]
    numel = metrics.numel(both["b_shape"].where(both["b_shape"].notna(), both["d_shape"]).tolist())
    sentinel = _inherit_sentinels(metrics.sentinel_extremes(dstat, bstat, both["d_dtype"], both["b_dtype"]),
                                  dstat, both, rid)
    sm = metrics.stat_metrics(dstat, bstat, numel)
    if sentinel["max"].any() or sentinel["min"].any():
        # the error estimate leaves out what a sentinel pair dominates; the differences shown
        # stay those of the recorded statistics, with a sentinel pair's set to 0 (same by meaning)
        judged = metrics.stat_metrics(*metrics.without_sentinels(dstat, bstat, sentinel), numel)
        sm["stat_error"], sm["nonfinite_mismatch"] = judged["stat_error"], judged["nonfinite_mismatch"]
        for s in ("max", "min"):
            sm[f"{s}_diff"] = np.where(sentinel[s], 0.0, sm[f"{s}_diff"])
            sm[f"{s}_rel_diff"] = np.where(sentinel[s], 0.0, sm[f"{s}_rel_diff"])
    for s in metrics.STATS:
        rows[f"{s}_diff"] = sm[f"{s}_diff"]
    for s in metrics.STATS:
        rows[f"{s}_rel_diff"] = sm[f"{s}_rel_diff"]
    rows["max_sentinel"] = sentinel["max"]
    rows["min_sentinel"] = sentinel["min"]
    for s in ("nan", "inf"):
        rows[f"device_{s}"] = dstat[s]
        rows[f"bench_{s}"] = bstat[s]
    rows["nonfinite_mismatch"] = sm["nonfinite_mismatch"]
    rows["stat_error"] = sm["stat_error"]
    rows["device_md5"] = both["d_md5"]
    rows["bench_md5"] = both["b_md5"]
    has_md5 = both["d_md5"].notna() & both["b_md5"].notna()
    # checksums of different algorithms (XXH3-64: 16 hex digits, MD5 of older dumps: 32, msprobe's
    # CRC-32: 8) have different lengths and say nothing about each other
    same_algo = matching.text_column(both["d_md5"]).str.len() == matching.text_column(both["b_md5"]).str.len()
    if (has_md5 & ~same_algo).any():
        log.warning("the two dumps' checksums come from different algorithms (e.g. an older dump's MD5 against "
                    "XXH3-64): they are not compared; re-dump both sides with the same torchparity version")
    has_md5 &= same_algo
    eq = (both["d_md5"] == both["b_md5"]).astype(object)
    rows["md5_equal"] = eq.where(has_md5, None)
    error = sm["stat_error"]
    same_dtype = (both["d_dtype"] == both["b_dtype"]).to_numpy()
    comparable = has_md5.to_numpy() & same_dtype
    rows["md5_differs"] = comparable & (both["d_md5"] != both["b_md5"]).to_numpy()
    rows["md5_comparable"] = comparable
    # scalar arguments
    kind = rows["kind"].to_numpy()
    scalar = (kind == "scalar") & (rows["match"].to_numpy() != "unmatched")
    rows["device_value"] = both["d_value"]
    rows["bench_value"] = both["b_value"]
    differs = np.zeros(n, dtype=bool)
    if scalar.any():
        idx = np.flatnonzero(scalar)
        dv, bv = both["d_value"].to_numpy()[idx], both["b_value"].to_numpy()[idx]
        differs[idx] = [not _same_value(x, y) for x, y in zip(dv, bv)]
        if differs.any():  # judged again with the record's dtypes (sentinels, low-precision rounding)
            at = np.flatnonzero(differs)
            d_dt, b_dt = _record_float_dtypes(both, rid, np.unique(rid[at]))
            dv, bv = both["d_value"].to_numpy()[at], both["b_value"].to_numpy()[at]
            differs[at] = [not _same_value(x, y, d_dt.get(int(r)), b_dt.get(int(r)))
                           for x, y, r in zip(dv, bv, rid[at].tolist())]
    rows["value_differs"] = differs
    unmatched = rows["match"].to_numpy() == "unmatched"
    error = np.where(unmatched | (kind != "tensor"), np.nan, error)
    rows["error"] = error
    rec_differs = pd.Series(differs).groupby(rid).transform("max").to_numpy(dtype=bool) if n else differs
    rows["args_differ"] = rec_differs & (rid >= 0)
    return rows


def _inherit_sentinels(sentinel: dict[str, np.ndarray], dstat: dict[str, np.ndarray], both: Any,
                       rid: np.ndarray) -> dict[str, np.ndarray]:
    """A device-only tensor (no bench counterpart: e.g. the bf16 run's cast of a masked score
    tensor to float32, a no-op in the float32 run) holding its dtype's sentinel at an extreme
    carries the sentinel of the tensor it was computed from: when its producer's output is a
    sentinel pair at that extreme, so is it."""
    if not len(rid) or not (sentinel["max"].any() or sentinel["min"].any()):
        return sentinel
    lim = metrics.dtype_limits(both["d_dtype"])
    dev_only = (rid >= 0) & (both["b_record_id"].fillna(-1).to_numpy() < 0)
    with np.errstate(invalid="ignore"):
        cand = {s: dev_only & (np.abs(dstat[s]) == lim) for s in ("max", "min")}
    if not (cand["max"].any() or cand["min"].any()):
        return sentinel
    from .rootcause import producer_columns

    io = matching.text_column(both["d_io"]).to_numpy(dtype=object)
    arg = matching.text_column(both["d_arg"]).to_numpy(dtype=object).astype(str)
    out_key = {(int(r), a): k for k, (r, i, a) in enumerate(zip(rid.tolist(), io, arg)) if i == "output"}
    p_rid, p_idx = producer_columns(both["d_producer"].to_numpy(dtype=object))
    out = {s: v.copy() for s, v in sentinel.items()}
    for s in ("max", "min"):
        for k in np.flatnonzero(cand[s]):
            src = out_key.get((int(p_rid[k]), str(p_idx[k])))
            if src is not None and sentinel[s][src] and np.sign(dstat[s][k]) == np.sign(dstat[s][src]):
                out[s][k] = True
    return out


_NONFINITE_TEXT = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _as_float(v: Any) -> float | None:
    """A float scalar argument as a float (the dump writes non-finite ones as text), else None
    (ints and bools are compared exactly)."""
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        return _NONFINITE_TEXT.get(v)
    return None


def _is_limit(v: float, dtype: str | None) -> bool:
    """``v`` is +-inf or +-finfo(t).max of ``dtype`` or of a float dtype narrower than it (an
    fp16-autocast run builds its masks from finfo(float16).min inside float32 tensors): a mask /
    fill sentinel."""
    if math.isinf(v):
        return True
    own = metrics.FINFO_MAX.get(dtype or "", math.nan)
    if abs(v) == own:
        return True
    return abs(v) in _NARROW_SENTINELS and not abs(v) > (own if not math.isnan(own) else math.inf)


_NARROW_SENTINELS = frozenset(metrics.FINFO_MAX[k] for k in ("float16", "bfloat16", "float32"))


def _same_value(a: Any, b: Any, d_dtype: str | None = None, b_dtype: str | None = None) -> bool:
    """Whether two scalar arguments are the same. Float scalars: exact (up to 1e-6 relative)
    unless the device run's float dtype (``d_dtype``, the record's lowest-precision float) is
    coarser than the bench's, then within one unit of that dtype's rounding; and the sentinel
    ``finfo(d_dtype).min`` (``.max``, ``+-inf``) matches the bench's same-signed sentinel. Ints,
    bools and strings (``approximate='tanh'`` vs ``'none'``) are compared exactly, dtype names
    excepted (they differ legitimately between a low-precision run and its benchmark)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    fa, fb = _as_float(a), _as_float(b)
    if fa is not None or fb is not None:
        fa = fa if fa is not None else (float(a) if isinstance(a, int) else None)
        fb = fb if fb is not None else (float(b) if isinstance(b, int) else None)
        if fa is None or fb is None:
            return False
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if fa == fb:
            return True
        if _is_limit(fa, d_dtype) and _is_limit(fb, b_dtype) \
                and math.copysign(1.0, fa) == math.copysign(1.0, fb):
            return True
        if math.isinf(fa) or math.isinf(fb):
            return False
        tol = 1e-6
        d_eps, b_eps = metrics.FINFO_EPS.get(d_dtype or "", 0.0), metrics.FINFO_EPS.get(b_dtype or "", 0.0)
        if d_eps > b_eps:
            tol = max(tol, d_eps)  # one unit in the last place of the device's dtype
        return abs(fa - fb) <= tol * max(abs(fa), abs(fb))
    if isinstance(a, str) and isinstance(b, str) and ("float" in a or "bfloat" in b or "float" in b):
        return True  # dtype arguments differ legitimately between a low-precision run and its benchmark
    return bool(a == b)


def _record_float_dtypes(both: Any, rid: np.ndarray, want: np.ndarray) -> tuple[dict[int, str], dict[int, str]]:
    """The lowest-precision float dtype of each device record in ``want`` (rows' record ids), on
    the device side and on the bench side (from the record's tensor rows)."""
    keep = np.isin(rid, want)
    out: tuple[dict[int, str], dict[int, str]] = ({}, {})
    for side, col in ((0, "d_dtype"), (1, "b_dtype")):
        for r, dt in zip(rid[keep].tolist(), both[col].to_numpy(dtype=object)[keep].tolist()):
            if isinstance(dt, str) and dt in metrics.FINFO_EPS:
                cur = out[side].get(r)
                if cur is None or metrics.FINFO_EPS[dt] > metrics.FINFO_EPS[cur]:
                    out[side][r] = dt
    return out


def _order(rid: np.ndarray, brid: np.ndarray, both: Any) -> np.ndarray:
    """Execution order of the device record; bench-only rows are placed after the device record
    paired with the closest earlier bench record."""
    order = rid.astype("float64")
    bonly = rid < 0
    if bonly.any():
        m = (rid >= 0) & (brid >= 0)
        pb, pd_ = brid[m], rid[m]
        if len(pb):
            srt = np.argsort(pb, kind="stable")
            pb, pd_ = pb[srt], pd_[srt]
            k = np.searchsorted(pb, brid[bonly], side="right") - 1
            order[bonly] = np.where(k >= 0, pd_[np.clip(k, 0, None)] + 0.5, -0.5)
        else:
            order[bonly] = -0.5
    return order


def add_tensor_metrics(rows: Any, both: Any, warnings: list[str], allow_partial: bool = False) -> None:
    """Full-tensor metrics for rows whose two tensors were saved (tensor mode)."""
    dt, bt = both["d_tensor"].to_numpy(), both["b_tensor"].to_numpy()
    idx = [i for i in range(len(rows)) if dt[i] is not None and bt[i] is not None
           and not (isinstance(dt[i], float)) and not (isinstance(bt[i], float))]
    if not idx:
        return
    unreadable = 0
    first_msg = ""
    cols = {c: rows[c].to_numpy(dtype=object).copy() for c in metrics.TENSOR_METRICS}
    err = rows["error"].to_numpy(dtype="float64").copy()
    nfm = rows["nonfinite_mismatch"].to_numpy(dtype=bool).copy()
    reasons = np.full(len(rows), "", dtype=object)
    from ..dump.reader import TensorLoader

    loader = TensorLoader()
    for i in idx:
        try:
            a, b = loader.load(dt[i]), loader.load(bt[i])
        except DumpError as exc:
            if not allow_partial:
                raise DumpError(f"{exc}; pass --allow-partial (allow_partial=True) to compare those rows on "
                                f"statistics only") from None
            unreadable += 1
            first_msg = first_msg or str(exc)
            reasons[i] = "tensor file unreadable: judged on statistics only"
            continue
        if a.numel() != b.numel():
            reasons[i] = f"shape differs ({tuple(a.shape)} vs {tuple(b.shape)})"
            continue
        metrics.put_tensor_metrics(cols, nfm, err, i, metrics.tensor_metrics(a, b), rows["match"].iat[i] != "unmatched")
    loader.close()
    metrics.tensor_metric_columns(rows, cols)
    rows["error"] = err
    rows["nonfinite_mismatch"] = nfm
    rows["note"] = reasons
    if unreadable:
        warnings.append(f"{unreadable} saved tensor(s) could not be read, those rows were compared on statistics "
                        f"only (first: {first_msg})")
