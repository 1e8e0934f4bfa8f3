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
    known = is_tuple[cd] & is_tuple[cb]
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
    sm = metrics.stat_metrics(dstat, bstat, numel)
    for s in metrics.STATS:
        rows[f"{s}_diff"] = sm[f"{s}_diff"]
    for s in metrics.STATS:
        rows[f"{s}_rel_diff"] = sm[f"{s}_rel_diff"]
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
    rows["value_differs"] = differs
    unmatched = rows["match"].to_numpy() == "unmatched"
    error = np.where(unmatched | (kind != "tensor"), np.nan, error)
    rows["error"] = error
    rec_differs = pd.Series(differs).groupby(rid).transform("max").to_numpy(dtype=bool) if n else differs
    rows["args_differ"] = rec_differs & (rid >= 0)
    return rows


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b or abs(a - b) <= 1e-6 * max(abs(a), abs(b))
    if isinstance(a, str) and isinstance(b, str) and ("float" in a or "bfloat" in b or "float" in b):
        return True  # dtype arguments differ legitimately between a low-precision run and its benchmark
    return bool(a == b)


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
        m = metrics.tensor_metrics(a, b)
        for c in metrics.TENSOR_METRICS:
            cols[c][i] = m[c]
        nfm[i] = nfm[i] or m["nonfinite_mismatch"]
        if rows["match"].iat[i] != "unmatched":
            err[i] = m["rel_l2"]
    loader.close()
    for c in metrics.TENSOR_METRICS:
        rows[c] = cols[c] if c == "worst_index" else cols[c].astype("float64")
    rows["error"] = err
    rows["nonfinite_mismatch"] = nfm
    rows["note"] = reasons
    if unreadable:
        warnings.append(f"{unreadable} saved tensor(s) could not be read, those rows were compared on statistics "
                        f"only (first: {first_msg})")
