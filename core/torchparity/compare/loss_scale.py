"""Loss scaling (``torch.amp.GradScaler``): compare scaled gradients divided by the scale.

A run with a GradScaler multiplies the loss by ``S`` (``scaler.scale(loss)``: one device-only
``mul`` of the one-element loss by the one-element scale tensor) and every gradient of that
backward pass is then ``S`` times the unscaled one, until the scaler unscales the parameters'
gradients in ``scaler.step``/``unscale_`` (``_amp_foreach_non_finite_check_and_unscale_``, whose
third argument is ``1/S``). Compared with a run without a scaler, every backward tensor "differs
by S - 1" and the scaling ``mul`` looks like the root cause.

:func:`normalise` finds, per side of one (step, rank), the rows that carry the scale and divides
their statistics (max/min/mean/norm scale linearly) and, in tensor mode, their tensors by ``S``
before the rows are judged. Checksums of scaled tensors cannot be divided: those rows are marked
not comparable on checksums. When both sides scale by the same ``S`` nothing changes.

Where the scale comes from, by dump level:

* api / aten / mix: the loss-scale ``mul`` (forward phase, a one-element tensor times a
  one-element factor) whose factor ``S`` is confirmed by the scaler's own ops in the same step:
  the unscale op's ``inv_scale`` (``1/S``) or ``_amp_update_scale_``'s scale, or by the next
  backward pass starting at that ``mul``. Every tensor of api/module backward records after it
  is a gradient, so scaled; at aten level the scale follows the data flow (a backward op's
  output is scaled when one of its inputs is), so saved activations and weights read by
  backward kernels are left alone.
* module only (no op is recorded): the scale is *inferred* when the device computed in float16
  (the compute-dtype flag of its module records) and its backward tensors are a power of two
  (>= 2) times the bench's, consistently; a warning says so (a real uniform power-of-two
  difference, e.g. ``reduction="sum"`` against ``"mean"`` over 2^k elements, would be hidden
  there: dump at api level to be sure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..naninf_rule import AMP_UNSCALE_OP, AMP_UPDATE_OP
from . import metrics

#: the scaler's unscale op and its argument holding ``1/S``
UNSCALE_OP, UPDATE_OP = AMP_UNSCALE_OP, AMP_UPDATE_OP
#: ops of the scaler's bookkeeping whose one-element S or 1/S tensors are divided too
SCALER_OPS = frozenset({"full", "to", "_to_copy", "copy_", "double", "float", "reciprocal", "mul", "lift_fresh",
                        "clone", "detach", UNSCALE_OP, UPDATE_OP})
#: relative agreement needed between the factor and the scaler's own record of ``S``
S_RTOL = 1e-6
#: module-level inference: largest relative spread of ``device / bench`` around ``2^k``
INFER_RTOL = 0.02
#: module-level inference: fraction of the paired backward tensors that must show that factor
INFER_MIN_AGREE = 0.8


@dataclass
class LossScale:
    """What was found on one side of one (step, rank)."""

    side: str  #: "device" or "bench"
    scales: list[float]  #: the loss scale(s) of its backward pass(es), in order
    how: str  #: "op <name>" or "inferred"
    n_rows: int  #: rows divided


def _base(op: Any) -> str:
    """``torch.Tensor.mul`` / ``aten.mul.Tensor`` / ``torch.mul`` -> ``mul``."""
    if not isinstance(op, str):
        return ""
    parts = op.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-1].strip("_") if parts[-1].startswith("__") else parts[-1]


def _one_value(row: Any, p: str) -> float | None:
    """The value of a one-element tensor row (max == min), else None."""
    shape = row[f"{p}shape"]
    if not isinstance(shape, tuple) or math.prod(shape) != 1:
        return None
    mx, mn = row[f"{p}max"], row[f"{p}min"]
    try:
        mx, mn = float(mx), float(mn)
    except (TypeError, ValueError):
        return None
    return mx if mx == mn and math.isfinite(mx) else None


def side_factors(both: Any, p: str) -> tuple[np.ndarray, list[float], str]:
    """Per row of ``both``: the loss scale that side's tensor carries (1.0: none), the scales
    found and how. ``p`` is the column prefix (``"d_"`` or ``"b_"``)."""
    import pandas as pd

    n = len(both)
    f = np.ones(n, dtype="float64")
    rid = both[f"{p}record_id"].to_numpy()
    # rows that exist on this side (a row of the other side only may carry its partner's record id)
    has = ~np.isnan(pd_num(rid)) & both[f"{p}name"].notna().to_numpy() & (pd_num(rid) >= 0)
    if not has.any():
        return f, [], ""
    rid_i = np.where(has, pd_num(rid), -1).astype(np.int64)
    op = both[f"{p}op"].to_numpy(dtype=object)
    phase = both[f"{p}phase"].to_numpy(dtype=object)
    io = both[f"{p}io"].to_numpy(dtype=object)
    arg = both[f"{p}arg"].astype(str).to_numpy(dtype=object)
    kind = both[f"{p}kind"].to_numpy(dtype=object)
    level = both[f"{p}level"].to_numpy(dtype=object)
    fwd = pd_num(both[f"{p}fwd"].to_numpy(dtype=object)) if f"{p}fwd" in both else np.full(n, np.nan)
    prod = both[f"{p}producer"].to_numpy(dtype=object)
    bases = {o: _base(o) for o in set(op[has].tolist())}
    base = np.array([bases.get(o, "") for o in op], dtype=object)

    # the scaler's own records of S in this unit
    known: list[float] = []
    for i in np.flatnonzero(has & (base == UNSCALE_OP) & (io == "input") & (arg == "2")):
        v = _one_value(both.iloc[i], p)
        if v:
            known.append(1.0 / v)
    for i in np.flatnonzero(has & (base == UPDATE_OP) & (io == "input") & (arg == "0")):
        v = _one_value(both.iloc[i], p)
        if v:
            known.append(v)

    # a loss-scale op is a forward mul whose output holds one value (the scaled loss): without
    # one, nothing is scaled (checked vectorised, before the per-record walk below)
    with np.errstate(invalid="ignore"):
        mx, mn = (pd.to_numeric(both[f"{p}{c}"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
                  for c in ("max", "min"))
        one = (has & (base == "mul") & (phase == "forward") & (io == "output") & (kind == "tensor")
               & (mx == mn) & np.isfinite(mx) & (mx != 0))
    if not one.any():
        return f, [], ""

    # first row of each record, records in execution order
    order = np.argsort(rid_i, kind="stable")
    order = order[has[order]]
    first: dict[int, int] = {}
    for i in order:
        first.setdefault(int(rid_i[i]), int(i))
    recs = sorted(first)
    rec_phase = {r: phase[first[r]] for r in recs}
    rows_of: dict[int, list[int]] = {}
    for i in order:
        rows_of.setdefault(int(rid_i[i]), []).append(int(i))

    found: list[tuple[int, float]] = []  # (loss-scale record id, S)
    for r in recs:
        if bases.get(op[first[r]]) != "mul" or rec_phase[r] != "forward":
            continue
        ins = [i for i in rows_of[r] if io[i] == "input" and kind[i] == "tensor"]
        outs = [i for i in rows_of[r] if io[i] == "output" and kind[i] == "tensor"]
        if len(ins) != 2 or len(outs) != 1:
            continue
        row_l, row_s, row_o = both.iloc[ins[0]], both.iloc[ins[1]], both.iloc[outs[0]]
        if _one_value(row_o, p) is None or _one_value(row_l, p) is None:
            continue
        s = _one_value(row_s, p)
        if s is None or s <= 0 or s == 1.0:
            continue
        confirmed = any(abs(s - k) <= S_RTOL * k for k in known)
        if not confirmed:  # the next backward pass starts at this mul (api level records fwd links)
            later = [q for q in recs if q > r and rec_phase[q] == "backward"]
            confirmed = bool(later) and any(fwd[i] == r for i in rows_of[later[0]])
        if confirmed:
            found.append((r, s))
    if not found:
        return f, [], ""

    # the scaler's own bookkeeping (the scale tensor S, its reciprocal 1/S): one-element tensors of
    # these ops holding exactly S or 1/S compare as 1 (two runs may use different scales)
    svals = {s for _, s in found} | set(known)
    for i in np.flatnonzero(has & (kind == "tensor") & (phase != "backward")):
        if base[i] not in SCALER_OPS:
            continue
        v = _one_value(both.iloc[i], p)
        if v is None or v == 0:
            continue
        for sv in svals:
            if abs(v - sv) <= S_RTOL * sv:
                f[i] = sv
            elif abs(v * sv - 1.0) <= S_RTOL:
                f[i] = 1.0 / sv
    # the gradients the unscale op reads (argument 0, a list) are still scaled by the last S
    for i in np.flatnonzero(has & (base == UNSCALE_OP) & (io == "input") & (kind == "tensor")):
        if str(arg[i]).split(".")[0] == "0":
            before = [sv for r, sv in found if r < rid_i[i]]
            if before:
                f[i] = before[-1]
    scaled_out: set[tuple[int, str]] = set()  # aten data flow: (record id, output index) scaled
    scale_of: dict[int, float] = {}
    for k, (r0, s) in enumerate(found):
        # the scaled loss itself, and what reads it (the autograd seed's ones_like at aten level)
        f[[i for i in rows_of[r0] if io[i] == "output" and kind[i] == "tensor"]] = s
        f[[i for i in np.flatnonzero(has & (io == "input")) if isinstance(prod[i], tuple)
           and int(prod[i][0]) == r0]] = s
        end = found[k + 1][0] if k + 1 < len(found) else None
        # every backward record up to the next loss-scale op: records of a backward call whose
        # hooks did not all fire are written late (at the step boundary), after the optimizer's
        for q in recs:
            if q <= r0 or (end is not None and q >= end) or rec_phase[q] != "backward":
                continue
            scale_of[q] = s
            idx = rows_of[q]
            ten = [i for i in idx if kind[i] == "tensor"]
            is_seed = any(fwd[i] == r0 for i in idx) or (
                bases.get(op[idx[0]]) == "mul" and any(io[i] == "output" and _one_value(both.iloc[i], p) == s for i in ten)
                and not any(io[i] == "input" and isinstance(prod[i], tuple) and tuple(prod[i]) in scaled_out for i in ten))
            if level[idx[0]] != "aten" and not is_seed:
                f[ten] = s  # api/module backward records hold gradients only
                continue
            scaled_in = [i for i in ten if io[i] == "input" and isinstance(prod[i], tuple)
                         and (int(prod[i][0]), str(prod[i][1])) in scaled_out]
            if scaled_in or is_seed:
                f[scaled_in] = s
                for i in ten:
                    if io[i] in ("output", "grad"):
                        f[i] = s
                        scaled_out.add((int(q), str(arg[i])))
    return f, [s for _, s in found], "op " + ", ".join(str(both.iloc[first[r]][f"{p}name"]) for r, _ in found)


def pd_num(x: Any) -> np.ndarray:
    import pandas as pd

    return pd.to_numeric(pd.Series(x, dtype=object), errors="coerce").to_numpy(dtype="float64")


def infer_module_scale(rows: Any, both: Any, device_computes_fp16: bool) -> float | None:
    """Module-level dumps (no op recorded): the power-of-two factor (>= 2) between the device's
    and the bench's backward tensors, when the device computed in float16 and every paired
    backward tensor with a non-zero norm shows the same factor; else None."""
    if not device_computes_fp16:
        return None
    sel = ((rows["phase"].to_numpy(dtype=object) == "backward") & (rows["kind"].to_numpy(dtype=object) == "tensor")
           & (rows["match"].to_numpy() != "unmatched"))
    dn, bn = rows["device_norm"].to_numpy(dtype="float64")[sel], rows["bench_norm"].to_numpy(dtype="float64")[sel]
    srt = np.argsort(rows["order"].to_numpy(dtype="float64")[sel], kind="stable")  # execution order
    dn, bn = dn[srt], bn[srt]
    ok = np.isfinite(dn) & np.isfinite(bn) & (bn > 0) & (dn > 0)
    if ok.sum() < 2:
        return None
    with np.errstate(divide="ignore"):
        k = np.log2(dn[ok] / bn[ok])
    kk = round(float(np.median(k)))
    agree = np.abs(np.exp2(k - kk) - 1.0) <= INFER_RTOL
    # the earliest backward tensor (the loss gradient entering the model) and nearly all others
    # (a gradient that is mathematically zero, e.g. a conv bias before a BatchNorm, is noise)
    if kk < 1 or not agree[0] or agree.mean() < INFER_MIN_AGREE:
        return None
    return float(2.0 ** kk)


def normalise(rows: Any, both: Any, warnings: list[str]) -> list[LossScale]:
    """Divide the loss scale out of the scaled rows of one (step, rank), in place (see the module
    docstring). Returns what was found on each side (empty: nothing scaled or the same scale)."""
    if not len(rows) or "d_op" not in both:
        return []
    fd, sd, how_d = side_factors(both, "d_")
    fb, sb, how_b = side_factors(both, "b_")
    found: list[LossScale] = []
    if not sd and not sb and _module_only(both):
        s = infer_module_scale(rows, both, _computes_fp16(both))
        if s is not None:
            back = ((both["d_phase"].to_numpy(dtype=object) == "backward")
                    & (both["d_kind"].to_numpy(dtype=object) == "tensor"))
            fd = np.where(back, s, 1.0)
            sd, how_d = [s], "inferred"
    differs = fd != fb
    if not differs.any():
        return []
    step = int(rows["step"].iat[0])
    if bool(sd) != bool(sb) and how_d != "inferred" and scaled_alike(rows, fd, fb, differs):
        # one side's scale op was not recorded (it ran outside a compiled graph), its gradients are
        # as large as the other side's: both runs scaled by the same S, nothing to divide
        side, ss = ("device", sd) if sd else ("bench", sb)
        warnings.append(f"step {step}: the {side} run scales its loss by {_g(ss)} (GradScaler) and the other "
                        f"run's backward tensors are just as large: it scales too, outside what its dump "
                        f"recorded (a compiled graph's caller); compared as they are")
        return []
    for side, f, ss, how in (("device", fd, sd, how_d), ("bench", fb, sb, how_b)):
        if ss:
            found.append(LossScale(side, ss, how, int(((f != 1.0) & differs).sum())))
            where = (f"the loss-scale op {how[3:]}" if how.startswith("op ")
                     else "inferred: module-level dump of a float16 run whose backward tensors are this power "
                          "of two times the other side's (dump at api level to see the scaler's ops)")
            warnings.append(f"step {step}: the {side} run scales its loss by {_g(ss)} (GradScaler; {where}): its "
                            f"{found[-1].n_rows} scaled backward tensors are compared divided by the scale, "
                            f"their checksums are not compared")
    _divide(rows, both, np.where(differs, fd, 1.0), np.where(differs, fb, 1.0), differs)
    if sd and sb:
        _same_scaler_arguments(rows, set(sd), set(sb))
    return found


def scaled_alike(rows: Any, fd: np.ndarray, fb: np.ndarray, differs: np.ndarray) -> bool:
    """Whether the paired tensors that one side's factor says are scaled have about the same
    magnitude on both sides (the median of ``log(device/bench) / log(fd/fb)`` over their norms is
    nearer 0 than 1): the other side was scaled too, by an op its dump did not record."""
    sel = differs & (rows["kind"].to_numpy(dtype=object) == "tensor") & (rows["match"].to_numpy() != "unmatched")
    dn, bn = rows["device_norm"].to_numpy(dtype="float64")[sel], rows["bench_norm"].to_numpy(dtype="float64")[sel]
    ratio = fd[sel] / fb[sel]
    ok = np.isfinite(dn) & np.isfinite(bn) & (dn > 0) & (bn > 0) & (ratio > 0) & (np.abs(np.log(ratio)) > 0.5)
    if ok.sum() < 2:
        return False
    k = np.log(dn[ok] / bn[ok]) / np.log(ratio[ok])
    return bool(np.median(k) < 0.5)


def _same_scaler_arguments(rows: Any, sd: set[float], sb: set[float]) -> None:
    """``torch.full((), S)`` creating each side's scale tensor: its differing scalar argument is
    the two scales, not a difference in the computation."""
    vd, vb = rows["device_value"].to_numpy(dtype=object), rows["bench_value"].to_numpy(dtype=object)
    diff = rows["value_differs"].to_numpy(dtype=bool, copy=True)
    ops = rows["op"].to_numpy(dtype=object)
    hit = False
    for i in np.flatnonzero(diff):
        if _base(ops[i]) == "full" and isinstance(vd[i], (int, float)) and isinstance(vb[i], (int, float)) \
                and float(vd[i]) in sd and float(vb[i]) in sb:
            diff[i], hit = False, True
    if hit:
        import pandas as pd

        rows["value_differs"] = diff
        rid = rows["d_record_id"].to_numpy()
        rows["args_differ"] = pd.Series(diff).groupby(rid).transform("max").to_numpy(dtype=bool) & (rid >= 0)


def _g(ss: list[float]) -> str:
    return "/".join(f"{s:g}" for s in ss)


def _module_only(both: Any) -> bool:
    lv = both["d_level"].dropna().unique().tolist()
    return bool(lv) and set(lv) <= {"module"}


def _computes_fp16(both: Any) -> bool:
    """Whether the device's module records say they computed in float16 (the compute-dtype flag)
    or hold float16 tensors."""
    if "d_compute_dtype" in both and (both["d_compute_dtype"] == "float16").any():
        return True
    return bool((both["d_dtype"] == "float16").any())


def _divide(rows: Any, both: Any, fd: np.ndarray, fb: np.ndarray, sel: np.ndarray) -> None:
    at = np.flatnonzero(sel)
    dstat = {s: rows[f"device_{s}"].to_numpy(dtype="float64")[at] / fd[at] for s in metrics.STATS}
    bstat = {s: rows[f"bench_{s}"].to_numpy(dtype="float64")[at] / fb[at] for s in metrics.STATS}
    for s in ("nan", "inf"):
        dstat[s] = rows[f"device_{s}"].to_numpy(dtype="float64")[at]
        bstat[s] = rows[f"bench_{s}"].to_numpy(dtype="float64")[at]
    shp = rows["bench_shape"].where(rows["bench_shape"].notna(), rows["device_shape"]).to_numpy(dtype=object)[at]
    sm = metrics.stat_metrics(dstat, bstat, metrics.numel(list(shp)))

    def put(col: str, vals: Any) -> None:
        arr = rows[col].to_numpy(copy=True)
        if arr.dtype != object and np.asarray(vals).dtype == object:
            arr = arr.astype(object)
        arr[at] = vals
        rows[col] = arr

    for s in metrics.STATS:
        put(f"device_{s}", dstat[s])
        put(f"bench_{s}", bstat[s])
        put(f"{s}_diff", sm[f"{s}_diff"])
        put(f"{s}_rel_diff", sm[f"{s}_rel_diff"])
    put("stat_error", sm["stat_error"])
    nfm = rows["nonfinite_mismatch"].to_numpy(dtype=bool, copy=True)
    nfm[at] = sm["nonfinite_mismatch"]
    rows["nonfinite_mismatch"] = nfm
    err = rows["error"].to_numpy(dtype="float64", copy=True)
    has_t = rows["cosine"].notna().to_numpy()[at] if "cosine" in rows else np.zeros(len(at), bool)
    keep = ~np.isnan(err[at])  # unmatched and non-tensor rows stay without an error
    err[at[keep & ~has_t]] = sm["stat_error"][keep & ~has_t]
    # checksums of a scaled tensor say nothing about the unscaled one
    for c, v in (("md5_comparable", False), ("md5_differs", False)):
        arr = rows[c].to_numpy(dtype=bool, copy=True)
        arr[at] = v
        rows[c] = arr
    eq = rows["md5_equal"].to_numpy(dtype=object, copy=True)
    eq[at] = None
    rows["md5_equal"] = eq
    # tensor mode: metrics of the divided tensors
    t_at = at[has_t]
    if len(t_at):
        from ..dump.reader import TensorLoader

        loader = TensorLoader()
        dt, bt = both["d_tensor"].to_numpy(), both["b_tensor"].to_numpy()
        cols = {c: rows[c].to_numpy(dtype=object, copy=True) for c in metrics.TENSOR_METRICS}
        for i in t_at:
            a, b = loader.load(dt[i]), loader.load(bt[i])
            metrics.put_tensor_metrics(cols, nfm, err, i, metrics.tensor_metrics(a.double() / fd[i], b.double() / fb[i]),
                                       rows["match"].iat[i] != "unmatched")
        loader.close()
        metrics.tensor_metric_columns(rows, cols)
        rows["nonfinite_mismatch"] = nfm
    rows["error"] = err
