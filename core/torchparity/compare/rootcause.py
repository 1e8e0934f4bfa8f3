"""Root cause: the earliest op that *introduced* a divergence rather than carried it.

Each device record gets an input error (the largest error of its tensor inputs and parameters,
taken from the producer's output through the data flow when the input itself is not compared)
and an output error (the largest error of its outputs; for a device-only op, the error its
consumers see on the tensors it produced). Its score is the amplification::

    score = output_error / max(input_error, floor(dtype))

where ``floor`` (:data:`NOISE_FLOOR`) is the relative error that rounding alone produces in the
lower-precision dtype of the pair (bf16 device vs fp32 bench: bf16 rounding), so rounding noise
never scores as amplification. An op is a suspect when its score reaches the threshold; the root cause is the
earliest suspect in execution order (inside a suspect module, its earliest suspect child).

A tensor that enters without a producer (a parameter or a model input) and already differs, while
nothing before it differed that much, is a *source*: reported as kind ``parameter``/``input``,
or blamed on an unmatched device-only op that ran just before it when there is one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..results import Suspect
from . import bwd_reductions, cancellation, compiled_inputs, error_model, grad_sinks, hidden_flips, masks
from .suspects import _enclosing_module, _fmt, _isnan, _prefer_inner

#: relative tolerances by dtype (torch.testing defaults); the floor is FLOOR_FACTOR times this.
DTYPE_RTOL = {
    "float16": 1e-3, "bfloat16": 1.6e-2, "float32": 1.3e-6, "float64": 1e-7,
    "float8_e4m3fn": 1.25e-1, "float8_e5m2": 2.5e-1, "complex64": 1.3e-6, "complex128": 1e-7,
}
FLOOR_FACTOR = 2.0
#: relative error that rounding alone can produce, per dtype: FLOOR_FACTOR x the torch.testing
#: rtol, except bf16, whose rtol (1.6e-2 = 4 ulp) is loose: 0.01 there (about 2.5 units of
#: roundoff). An unfaulted emulated-bf16 TinyLlama step stays below 2.2 x this floor on every op,
#: while a x1.1 fault in one op already scores ~10.
NOISE_FLOOR = {k: FLOOR_FACTOR * v for k, v in DTYPE_RTOL.items()}
NOISE_FLOOR["bfloat16"] = 1e-2
DEFAULT_THRESHOLD = 10.0
_PRECISION_ORDER = ["float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "float32", "complex64", "float64", "complex128"]


def pair_dtype(*dtypes: Any) -> str:
    """The lower-precision floating dtype of a pair (the one whose rounding bounds the error)."""
    cands = [x for x in dtypes if isinstance(x, str) and x in DTYPE_RTOL]
    if not cands:
        return "float32"
    return min(cands, key=lambda x: _PRECISION_ORDER.index(x) if x in _PRECISION_ORDER else 99)


def judge_dtypes(rows: Any, dtype_override: str | None = None, device_compute: Any = None,
                 bench_compute: Any = None) -> np.ndarray:
    """Per row, the dtype whose rounding bounds the expected error: the lower-precision floating
    dtype of the pair, or ``dtype_override`` when that is lower (a device that emulates bf16 while
    storing float32 tensors is judged against bf16), or a side's compute dtype when that is lower
    (``device_compute``/``bench_compute``: per row, the module record's ``flags["compute_dtype"]``:
    a module whose inner ops ran in bf16 or under fp16 autocast but returns float32 is judged
    against that precision; None/NaN or no column: no flag, judged as before)."""
    import pandas as pd

    dd, bd = rows["device_dtype"].to_numpy(dtype=object), rows["bench_dtype"].to_numpy(dtype=object)
    if not len(dd):
        return np.empty(0, dtype=object)

    def col(x: Any) -> np.ndarray:
        a = np.asarray(x, dtype=object) if x is not None else None
        return a if a is not None and len(a) == len(dd) else np.full(len(dd), None, dtype=object)

    # one decision per distinct (device dtype, bench dtype, compute dtypes) (factorized in C)
    codes, uniq = zip(*(pd.factorize(c, use_na_sentinel=False) for c in (dd, bd, col(device_compute), col(bench_compute))))
    sizes = [max(len(u), 1) for u in uniq]
    key = np.zeros(len(dd), dtype=np.int64)
    for c, n in zip(codes, sizes):
        key = key * n + c.astype(np.int64)
    keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    vals = np.empty(len(keys), dtype=object)
    for k, i in enumerate(first):
        d, b, dc, bc = (u[c[i]] for u, c in zip(uniq, codes))
        floating = any(isinstance(x, str) and x in DTYPE_RTOL for x in (d, b))
        extra = [x for x in (dtype_override, dc, bc) if isinstance(x, str) and x] if floating else []
        vals[k] = pair_dtype(d, b, *extra)
    return vals[inverse.reshape(-1)]


def floors(rows: Any, dtype_override: str | None = None) -> np.ndarray:
    """Noise floor per row: :data:`NOISE_FLOOR` of its judge dtype."""
    jd = rows["judge_dtype"].to_numpy(dtype=object) if "judge_dtype" in rows else judge_dtypes(rows, dtype_override)
    import pandas as pd

    table = NOISE_FLOOR
    codes, uniq = pd.factorize(pd.Series(list(jd), dtype=object).to_numpy(), use_na_sentinel=False)
    vals = np.array([table.get(x, table["float32"]) if isinstance(x, str) else table["float32"] for x in uniq],
                    dtype="float64")
    return vals[codes] if len(jd) else np.empty(0, dtype="float64")


def producer_columns(prod: np.ndarray) -> tuple[Any, np.ndarray]:
    """``(record id, output index as text)`` of each ``producer`` entry (a ``(rid, index)``
    tuple); ``-1`` and ``""`` where there is none. Integer pairs are split with numpy and each
    distinct index is turned into text once; anything else goes through the generic rule."""
    n = len(prod)
    p_rid = np.full(n, -1, dtype=np.int64)
    p_idx = np.full(n, "", dtype=object)
    is_tuple = np.fromiter(map(type, prod), dtype=object, count=n) == tuple
    at = np.flatnonzero(is_tuple)
    if len(at):
        at = at[np.fromiter(map(len, prod[at]), dtype=np.int64, count=len(at)) == 2]
    if not len(at):
        return p_rid, p_idx
    pairs = np.array(prod[at].tolist())
    if pairs.ndim != 2 or pairs.dtype.kind not in "iu":  # not integer pairs: one by one
        return ([p[0] if isinstance(p, tuple) and len(p) == 2 else -1 for p in prod],
                np.array([str(p[1]) if isinstance(p, tuple) and len(p) == 2 else "" for p in prod], dtype=object))
    p_rid[at] = pairs[:, 0]
    uniq, inv = np.unique(pairs[:, 1], return_inverse=True)
    p_idx[at] = np.array([str(int(u)) for u in uniq], dtype=object)[inv.reshape(-1)]
    return p_rid, p_idx


@np.errstate(over="ignore", invalid="ignore")  # Inf/huge values on one side: Inf or NaN errors, no warning
def analyse(rows: Any, *, threshold: float = DEFAULT_THRESHOLD, step: int = 0, rank: int = 0,
            stacks: dict[int, list[str]] | None = None,
            carried_state: bool = False, sources: bool = True,
            unjudged: set[int] | None = None) -> tuple[dict[str, np.ndarray], list[Suspect]]:
    """Score the records of one (step, rank). ``rows`` are compare rows of that pair with
    columns ``d_record_id, order, io, kind, error, floor, producer, arg, match, device_name,
    bench_name, op, module, phase, level, d_stack, args_differ``.

    ``sources=False`` (a compiled graph against eager ops): an input that enters already differing
    blames neither an op only one side recorded (the compiled graph holds most eager ops' values
    inside fused kernels, so "unmatched" says nothing) nor the model's inputs; a fault inside the
    graph shows at the next captured value instead.

    With ``carried_state`` (both dumps hold an earlier step that was trained), tensors that enter
    without a producer (parameters, optimizer state) carry what the earlier steps' updates made of
    them - a bf16 run's weights drift from the fp32 run's by design (Adam turns a gradient that is
    noise on both sides, like a key bias under softmax, into +-lr) - so they are never reported as
    sources ("check the weights"); their error is the input error of the ops that read them.

    ``unjudged``: device record ids whose input error is not known in full (a compiled record
    reading a parameter after a trained step, :func:`.compiled.reads_graph_inputs`): never scored.

    Returns per-row arrays (``input_error``, ``amplification``) and the suspects, earliest first.
    """
    import pandas as pd

    dev = rows["d_record_id"].to_numpy() >= 0
    r = pd.DataFrame({
        "rid": rows["d_record_id"].to_numpy(), "io": rows["io"].to_numpy(), "kind": rows["kind"].to_numpy(),
        "err": rows["error"].to_numpy(dtype="float64"), "floor": rows["floor"].to_numpy(dtype="float64"),
        "arg": rows["arg"].astype(str).to_numpy(), "matched": (rows["match"] != "unmatched").to_numpy(),
    })[dev]
    prod = rows["producer"].to_numpy()[dev]
    r["p_rid"], r["p_idx"] = producer_columns(prod)
    is_out = r["io"].isin(["output", "grad"]) & (r["kind"] == "tensor")
    is_in = r["io"].isin(["input", "param"]) & (r["kind"] == "tensor")

    recs = _records(rows[dev])
    rec_ids = recs.index.to_numpy()
    fwd = (pd.to_numeric(recs["d_fwd"], errors="coerce").to_numpy(dtype="float64")
           if "d_fwd" in recs else np.full(len(rec_ids), np.nan))
    o_err, i_err, ins = _flow(r, r["err"].to_numpy(), is_in, is_out, rec_ids, fwd)
    has_inputs = pd.Series(True, index=ins["rid"].unique()).reindex(rec_ids).fillna(False).to_numpy(dtype=bool)
    # a record whose only tensors are parameter gradients is a sink (the gradient was computed by
    # the backward ops before it): it has no input error of its own and is never scored. Other
    # records without tensor inputs (factory ops: randn, arange...) start from a zero input error.
    grad_only = (r.assign(g=r["io"] == "grad").groupby("rid")["g"].all().reindex(rec_ids)
                 .fillna(False).to_numpy(dtype=bool))
    no_in = ~has_inputs & ~grad_only
    if not sources:
        # compiled against eager: an eager op whose inputs the graph fused away (GPT-2's GELU: its
        # mul/pow/tanh chain) reads what the compared values before them carried
        # (and one that knows some inputs only: BERT's bf16 key-weight gradient reads a compared
        # activation and a gradient no compiled value holds, ~0 by cancellation under softmax)
        rec_floor = r.groupby("rid")["floor"].max().reindex(rec_ids).to_numpy()
        traced = compiled_inputs.through_unmatched(r, is_in, rec_ids, o_err, recs, rec_floor)
        partial = (ins.assign(u=ins["err"].isna()).groupby("rid")["u"].any().reindex(rec_ids)
                   .fillna(False).to_numpy(dtype=bool))
        i_err = np.where(partial & ~np.isnan(traced), np.fmax(i_err, traced), i_err)
        # a compiled record holds its output only: one whose inputs could not be traced (a compiled
        # graph against another, or eager inputs the graph holds no counterpart of) read values
        # made before it (or parameters, equal in a first step; later steps: ``unjudged``), so its
        # input error is at most the largest error before it in execution order - not zero, as
        # for a factory op (which blamed the first op past the floor after a small fault upstream)
        i_err = np.where(np.isnan(i_err) & ~grad_only, compiled_inputs.error_before(o_err, recs["order"].to_numpy()), i_err)
    i_err = np.where(np.isnan(i_err) & no_in, 0.0, i_err)
    # the two channels of the statistics error (error_model): aggregate and extreme, each carried
    # through the data flow on its own
    agg_row, ext_row = error_model.stat_channels(rows)
    fam = error_model.op_families(recs["op"].to_numpy(dtype=object))
    # a record with a differing integer output (expert indices out of a MoE router module, the
    # indices of a max) made a discrete choice: a selection, whatever its name
    int_out = error_model.integer_rows(rows)[dev] & is_out.to_numpy() & (np.nan_to_num(r["err"].to_numpy(), nan=0.0) > 0)
    if int_out.any():
        chose = r.assign(c=int_out).groupby("rid")["c"].any().reindex(rec_ids).fillna(False).to_numpy(dtype=bool)
        fam = np.where(chose & (fam != "cast"), "selection", fam)
    # a product with a 0/s mask the two runs share (dropout's mask): it selects a subset of the
    # other input, whose errors no longer cancel in its norm and mean (softmax rows that summed to
    # 1): its aggregate channel is not scored, its extreme channel is (a fault scales the kept values)
    masked = masks.mask_products(rows, dev, r, is_in, recs, fam)
    powers = error_model.stems_in(recs["op"].to_numpy(dtype=object), error_model.POWER_STEMS)
    opt_phase = (recs["phase"].to_numpy(dtype=object) == "optimizer") if "phase" in recs else np.zeros(len(rec_ids), bool)
    # every optimizer update divides by a data-dependent denominator
    fam = np.where(opt_phase & (fam != "cast"), "ill_conditioned", fam)
    nf_out = (r.assign(nf=rows["nonfinite_mismatch"].fillna(False).to_numpy(dtype=bool)[dev])[is_out]
              .groupby("rid")["nf"].any().reindex(rec_ids).fillna(False).to_numpy(dtype=bool)
              if "nonfinite_mismatch" in rows else np.zeros(len(rec_ids), dtype=bool))
    cancelling = fam == "cancelling"
    if cancelling.any():  # an output ~0 by cancellation: its error against what went into it
        agg_row = cancellation.against_inputs(r, agg_row[dev], error_model.cancel_scale(rows)[dev], is_in, is_out,
                                  pd.Series(cancelling, index=rec_ids))
    else:
        agg_row = agg_row[dev]
    from .metrics import numel

    shapes = rows["bench_shape"].where(rows["bench_shape"].notna(), rows["device_shape"]) if "bench_shape" in rows else None
    nel = numel(shapes.tolist())[dev] if shapes is not None else np.full(int(dev.sum()), np.nan)
    out_n = r.assign(n=nel)[is_out].groupby("rid")["n"].max().reindex(rec_ids).to_numpy()
    ext_row = ext_row[dev]
    out_scale = None
    if "phase" in recs:  # a gradient ~0 by cancellation next to the record's other gradients
        bwd = pd.Series(recs["phase"].to_numpy(dtype=object) == "backward", index=rec_ids)
        fac = cancellation.cancelled_outputs(r, error_model.cancel_scale(rows)[dev], is_out, bwd)
        agg_row, ext_row = agg_row * fac, ext_row * fac
        # a device-only record's output is seen by its consumers: their inputs, scaled alike
        small = is_out.to_numpy() & (fac < 1.0)
        if small.any():
            out_scale = pd.Series(fac[small], index=pd.MultiIndex.from_arrays([r["rid"].to_numpy()[small],
                                                                                r["arg"].to_numpy()[small]]))
            out_scale = out_scale[~out_scale.index.duplicated()]
    # parameter gradients of a module-level dump: judged against the module's backward (grad_sinks)
    sink = grad_sinks.judged_sinks(recs, grad_only)
    if sink.any():
        fac = grad_sinks.sibling_factor(r, error_model.cancel_scale(rows)[dev], is_out,
                                        pd.Series(sink, index=rec_ids), recs["module"])
        agg_row, ext_row = agg_row * fac, ext_row * fac
    # the gradient of a broadcast factor (an api-level mul's backward): a sum, judged as a reduction
    # on its own aggregate channel (bwd_reductions)
    red_row = bwd_reductions.reduction_rows(recs, r, is_in, is_out, nel)
    if red_row.any():
        o_agg_red = pd.Series(np.where(red_row, agg_row, np.nan)).groupby(r["rid"].to_numpy()).max() \
            .reindex(rec_ids).to_numpy(dtype="float64")
        n_red = pd.Series(np.where(red_row, nel, np.nan)).groupby(r["rid"].to_numpy()).max() \
            .reindex(rec_ids).to_numpy(dtype="float64")
        agg_row, ext_row = np.where(red_row, np.nan, agg_row), np.where(red_row, np.nan, ext_row)
    o_agg, i_agg, _ = _flow(r, agg_row, is_in, is_out, rec_ids, fwd, out_scale)
    o_ext, i_ext, _ = _flow(r, ext_row, is_in, is_out, rec_ids, fwd, out_scale)
    if red_row.any():  # a record whose outputs are all such sums: no other channel (not its consumers')
        only_red = pd.Series(np.where(is_out.to_numpy(), red_row, True)).groupby(r["rid"].to_numpy()).all() \
            .reindex(rec_ids).fillna(False).to_numpy(dtype=bool) & ~np.isnan(o_agg_red)
        o_agg, o_ext = np.where(only_red, np.nan, o_agg), np.where(only_red, np.nan, o_ext)
    # the inputs' elementwise error as the norm of the whole error vector (error_model.peak_factor):
    # what a cancelling op (a reduction) adds up
    _, i_vec, _ = _flow(r, r["err"].to_numpy() * error_model.peak_factor(rows)[dev], is_in, is_out, rec_ids, fwd)
    if sink.any():  # a gradient is a reduction over the batch: its norm channel only, like a cancelling op
        i_err, i_agg, i_ext, i_vec = grad_sinks.inherit(recs, sink, i_err, i_agg, i_ext, i_vec)
        cancelling = cancelling | sink
        in_n = r.assign(n=nel)[is_in].groupby("rid")["n"].max().reindex(rec_ids).to_numpy()
        red = grad_sinks.reduction_allowance(recs, sink, in_n, out_n)
        summed = grad_sinks.sum_allowance(recs, sink, r, rows, dev, is_in, is_out, red)
    else:
        red = np.ones(len(rec_ids))
        summed = np.ones(len(rec_ids))
    floor = r.groupby("rid")["floor"].max().reindex(rec_ids).to_numpy()
    args_differ = recs["args_differ"].to_numpy(dtype=bool) if "args_differ" in recs else np.zeros(len(rec_ids), bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = np.fmax(np.nan_to_num(i_err, nan=np.inf, posinf=np.inf, neginf=-np.inf), floor)
        plain = np.where(np.isinf(o_err) & np.isinf(denom), np.nan, o_err / denom)
        # extreme channel: elementwise noise (the dtype's floor), against the inputs' largest error
        # (after a trained step, carried_state, the inputs' error is no longer rounding proportional
        # to each element: parameters drifted by Adam's +-lr on small and large elements alike, so
        # the error seen at an input's largest element is as large in absolute terms on its small
        # ones - a slice, a product, a dot product reading them shows it relative to its own,
        # smaller, magnitude: the extreme channel is measured against the whole error vector, i_vec)
        e_den = np.fmax(denom, np.nan_to_num(i_vec, nan=0.0)) if carried_state else denom
        # and against the sparse error a threshold's backward upstream hides from the statistics
        hidden = hidden_flips.hidden_inputs(recs, r, is_in, i_err)
        e_den = np.fmax(e_den, hidden)
        s_ext = np.where(np.isinf(o_ext) & np.isinf(e_den), np.nan, o_ext / e_den)
        # aggregate channel: its own (smaller) floor, against the inputs' aggregate error
        # (elementwise input errors e reach the output's norm too: averaged to ~e/sqrt(n) over n
        # independent elements at best, a fraction AGG_FROM_EXT of e when they are correlated)
        # (an input whose norm is unknown, e.g. left out for a finfo.min mask, carries no
        # aggregate error of its own: only its elementwise one, through the term below)
        i_agg_k = np.where(np.isnan(i_agg) & ~np.isnan(i_err), 0.0, i_agg)
        agg_frac = np.where(fam == "matmul", error_model.AGG_FLOOR_FRACTION_MATMUL, error_model.AGG_FLOOR_FRACTION)
        # (a cancelling op sums its inputs' elements: their elementwise errors reach its output as
        # the whole error vector's norm, not the largest element's relative error; a parameter
        # gradient of a module-level dump sums products over the batch, whose elements carry the
        # inputs' relative error and whose norm averages it out: its own reduction allowance)
        i_el = np.where(cancelling & ~sink, np.fmax(i_err, i_vec), i_err)
        a_den = np.fmax(np.fmax(np.nan_to_num(i_agg_k, nan=np.inf, posinf=np.inf), floor * agg_frac * red),
                        np.nan_to_num(i_el, nan=0.0) * np.fmax(error_model.AGG_FROM_EXT,
                                                                 1.0 / np.sqrt(np.fmax(np.nan_to_num(out_n, nan=1.0), 1.0))))
        # a bias gradient of a module-level dump sums its module's output gradient: its error can
        # reach sqrt(m) ||input|| / ||bias grad|| times the input's (grad_sinks.sum_allowance)
        a_den = np.where(summed > 1.0, np.fmax(a_den, np.nan_to_num(i_err, nan=0.0) * summed), a_den)
        a_den = np.fmax(a_den, hidden * hidden_flips.HIDDEN_TO_NORM)
        # a power (RMSNorm's x**2): its norm may carry twice the inputs' largest elementwise error
        a_den = np.where(powers, np.fmax(a_den, 2.0 * np.nan_to_num(i_el, nan=0.0)), a_den)
        s_agg = np.where(np.isinf(o_agg) & np.isinf(a_den), np.nan, o_agg / a_den)
        red_led = np.zeros(len(rec_ids), dtype=bool)
        if red_row.any():  # a sum: against its inputs' whole error vector
            i_red = np.fmax(i_err, i_vec)
            r_den = np.fmax(np.fmax(np.nan_to_num(i_agg_k, nan=np.inf, posinf=np.inf),
                                    floor * error_model.AGG_FLOOR_FRACTION),
                            np.nan_to_num(i_red, nan=0.0) * np.fmax(error_model.AGG_FROM_EXT,
                                                                    1.0 / np.sqrt(np.fmax(np.nan_to_num(n_red, nan=1.0), 1.0))))
            s_red = np.where(np.isinf(o_agg_red) & np.isinf(r_den), np.nan, o_agg_red / r_den)
            red_led = np.nan_to_num(s_red, nan=-1.0) > np.nan_to_num(s_agg, nan=-1.0)
            s_agg, o_agg = np.where(red_led, s_red, s_agg), np.where(red_led, o_agg_red, o_agg)
            i_agg = np.where(red_led, i_red, i_agg)
            agg_frac = np.where(red_led, error_model.AGG_FLOOR_FRACTION, agg_frac)
        # cancelling ops (normalisations, reductions, weight/bias gradients): the aggregate channel
        # only (measured against what went into them); a NaN/Inf created stays a finding
        # (where the aggregate channel is known: tensor mode has one full-tensor error, judged as before)
        s_ext = np.where(cancelling & np.isfinite(o_ext) & ~np.isnan(o_agg), np.nan, s_ext)
        s_agg = np.where(masked & np.isfinite(s_ext), np.nan, s_agg)
        # an optimizer update is elementwise, its norm weighs elements otherwise than its inputs'
        # (exp_avg_sq's g*g: 8x in norm, 2x per element): judged on the extreme channel
        s_agg = np.where(opt_phase & np.isfinite(s_ext), np.nan, s_agg)
        score = np.fmax(s_agg, s_ext)
        score = np.where(np.isnan(score) & np.isinf(o_err), plain, score)
        # selection, ill-conditioned and cast ops: judged only when their inputs agree (fp32 noise)
        discrete = np.isin(fam, ("selection", "ill_conditioned", "cast"))
        agree = np.nan_to_num(i_err, nan=np.inf) <= NOISE_FLOOR["float32"]
        score = np.where(discrete & ~agree & ~nf_out, np.nan, score)
        score = np.where(np.isnan(i_err), np.nan, score)
        agg_led = np.nan_to_num(s_agg, nan=-1.0) > np.nan_to_num(s_ext, nan=-1.0)
        # a differing scalar argument (approximate='tanh' vs 'none') with a differing output
        score = np.where(args_differ & (o_err > floor), np.fmax(np.nan_to_num(score, posinf=np.inf, neginf=-np.inf), threshold), score)
    # md5 mode: an output checksum differs while every input is bit-identical
    md5_rule = np.zeros(len(rec_ids), dtype=bool)
    if "md5_differs" in rows and bool(rows["md5_differs"].any()):
        m = pd.DataFrame({"rid": rows["d_record_id"].to_numpy(), "io": rows["io"].to_numpy(),
                          "kind": rows["kind"].to_numpy(), "diff": rows["md5_differs"].to_numpy(dtype=bool),
                          "ok": (rows["md5_comparable"].to_numpy(dtype=bool) & ~rows["md5_differs"].to_numpy(dtype=bool))})
        m = m[(m["rid"] >= 0) & (m["kind"] == "tensor")]
        o = m[m["io"].isin(["output", "grad"])].groupby("rid")["diff"].any()
        i_ok = m[m["io"].isin(["input", "param"])].groupby("rid")["ok"].all()
        md5_rule = (o.reindex(rec_ids).fillna(False).to_numpy(dtype=bool)
                    & i_ok.reindex(rec_ids).fillna(True).to_numpy(dtype=bool))
        score = np.where(md5_rule, np.fmax(np.nan_to_num(score, posinf=np.inf, neginf=-np.inf), threshold), score)
    # a cast on the device side only (a bf16 run's casts are no-ops in fp32) is rounding to its
    # target dtype, which cannot amplify an error: never scored. What its consumers see is judged
    # at the consumers (their paired inputs may be other partial sums: autograd accumulates a
    # gradient in another order when a cast node sits between the uses of a tensor).
    # So is a copy on the device side only (a gradient accumulation's first ``copy_`` into
    # ``.grad``, a layout copy): it changes no value.
    from .compiled import LAYOUT_COPIES
    from .matching import is_cast

    lone_cast = (recs["match"].to_numpy() == "unmatched") & recs["op"].map(
        lambda op: is_cast(op) or op in LAYOUT_COPIES or op == "aten.copy_.default").to_numpy(dtype=bool)
    score = np.where(lone_cast & ~np.isinf(o_err), np.nan, score)
    if unjudged:
        score = np.where(np.isin(rec_ids, np.fromiter(unjudged, dtype=np.int64, count=len(unjudged))), np.nan, score)
    order = recs["order"].to_numpy()
    sus = np.nan_to_num(score, nan=0.0, posinf=np.inf, neginf=-np.inf) >= threshold

    suspects: list[Suspect] = []

    def mk(i: int, sc: float, ie: float, oe: float, reason: str, kind: str = "op") -> Suspect:
        row = recs.iloc[i]
        st = row.get("d_stack")
        frames = stacks.get(int(st)) if stacks and st is not None and not _isnan(st) else None
        return Suspect(name=str(row["device_name"]), op=str(row["op"]), module=str(row["module"]),
                       phase=str(row["phase"]), step=step, rank=rank, index=int(order[i]), score=float(sc),
                       input_error=float(ie), output_error=float(oe), reason=reason,
                       bench_name=None if _isnan(row["bench_name"]) else str(row["bench_name"]),
                       level=str(row.get("level") or ""), kind=kind, stack=frames)

    matched_rec = recs["match"].to_numpy() != "unmatched"
    for i in np.flatnonzero(sus):
        ie, oe = float(np.nan_to_num(i_err[i], posinf=np.inf, neginf=-np.inf)), float(o_err[i])
        what = "output" if matched_rec[i] else "output (seen by its consumers; this op exists on the device side only)"
        if md5_rule[i] and not (o_err[i] / max(ie, floor[i]) >= threshold):
            reason = "its output checksum differs from the benchmark while all its inputs are bit-identical"
        elif args_differ[i] and (math.isnan(score[i]) or o_err[i] / max(ie, floor[i]) < threshold):
            reason = f"a scalar argument differs from the benchmark and its {what} error is {_fmt(oe)}"
        elif math.isinf(oe) and nf_out[i]:
            reason = f"its inputs are finite-equal (error {_fmt(ie)}) but its {what} has NaN/Inf that the benchmark does not"
        elif math.isinf(oe):
            reason = f"its {what} differs where the benchmark's is exactly zero, while its input error is {_fmt(ie)}"
        elif agg_led[i] and red_led[i]:
            reason = (f"{what} norm error {_fmt(o_agg[i])} (a gradient summed over broadcast dimensions) vs its inputs' "
                      f"whole error vector {_fmt(i_agg[i])} (floor {_fmt(floor[i] * agg_frac[i])}): amplified "
                      f"{_fmt(score[i])}x, threshold {threshold:g}")
        elif agg_led[i]:
            reason = (f"{what} norm error {_fmt(o_agg[i])} vs input norm error {_fmt(i_agg[i])} "
                      f"(floor {_fmt(floor[i] * agg_frac[i])}): amplified {_fmt(score[i])}x, "
                      f"threshold {threshold:g}")
        else:
            reason = (f"{what} error {_fmt(oe)} vs input error {_fmt(ie)} (floor {_fmt(floor[i])}): "
                      f"amplified {_fmt(score[i])}x, threshold {threshold:g}")
        suspects.append(mk(i, score[i], ie, oe, reason))

    # sources: a tensor without producer that differs while nothing before it differed as much
    src = ins[(ins["p_rid"] < 0) & ins["err"].notna()]
    if unjudged:
        src = src[~src["rid"].isin(unjudged)]
    if len(src) and not carried_state and sources:
        pos = pd.Series(np.arange(len(rec_ids)), index=rec_ids)
        o_sorted_idx = np.argsort(order, kind="stable")
        run_max = np.fmax.accumulate(np.nan_to_num(o_err[o_sorted_idx], nan=0.0, posinf=np.inf, neginf=-np.inf))
        prev_max = np.concatenate([[0.0], run_max[:-1]])
        prev_at = np.empty(len(rec_ids))
        prev_at[o_sorted_idx] = prev_max
        unmatched_orders = np.sort(order[~matched_rec & ~lone_cast])
        seen: set[int] = set()
        # per record (first-appearance order): largest error, its row, the floor; only the
        # records that pass the test are visited in Python
        gsrc = src.groupby("rid", sort=False)
        e_all, fl_all, at_all = gsrc["err"].max(), gsrc["floor"].max(), gsrc["err"].idxmax()
        i_all = pos.reindex(e_all.index).to_numpy().astype(int)
        ok_all = (e_all.to_numpy() >= threshold * fl_all.to_numpy()) & (e_all.to_numpy() > threshold * prev_at[i_all])
        for rid, i, e, fl, at in zip(e_all.index[ok_all], i_all[ok_all], e_all.to_numpy()[ok_all],
                                     fl_all.to_numpy()[ok_all], at_all.to_numpy()[ok_all]):
            i, e, fl = int(i), float(e), float(fl)
            if i in seen:
                continue
            seen.add(i)
            io = src.loc[at]
            k = np.searchsorted(unmatched_orders, order[i])
            if k > 0:  # an unmatched device op ran before: blame it
                uo = unmatched_orders[k - 1]
                j = int(np.flatnonzero(order == uo)[0])
                suspects.append(mk(j, e / fl, 0.0, e,
                                   f"exists on the device side only; the next compared input ({recs.iloc[i]['device_name']} "
                                   f"{io['io']}.{io['arg']}) differs by {_fmt(e)} while nothing before it did"))
                continue
            j = _enclosing_module(recs, i) if io["io"] != "param" else None
            if j is not None:  # module level: computed inside the parent, between its recorded children
                suspects.append(mk(j, e / fl, 0.0, e,
                                   f"the input {io['arg']} of its child {recs.iloc[i]['device_name']} differs by {_fmt(e)} "
                                   f"while nothing before it did: it was computed inside this module, between its "
                                   f"children, by code the module level does not record (dump at api or aten level "
                                   f"to see the op)"))
                continue
            kind = "parameter" if io["io"] == "param" else "input"
            suspects.append(mk(i, e / fl, e, float(np.nan_to_num(o_err[i], posinf=np.inf, neginf=-np.inf)),
                               f"{kind} {io['io']}.{io['arg']} already differs by {_fmt(e)} when it enters this op "
                               f"(no op before it differs): check the {'weights/checkpoint' if kind == 'parameter' else 'model inputs / data loading'}",
                               kind=kind))
    suspects.sort(key=lambda s: (s.index, -s.score))
    suspects = _prefer_inner(suspects)

    # per-row arrays
    rec_pos = pd.Series(np.arange(len(rec_ids)), index=rec_ids)
    rid_all = rows["d_record_id"].to_numpy()
    idx = rec_pos.reindex(rid_all).to_numpy()
    ok = ~np.isnan(idx)
    ii = np.where(ok, idx, 0).astype(int)
    input_error = np.where(ok, i_err[ii] if len(rec_ids) else np.nan, np.nan)
    amp = np.where(ok, score[ii] if len(rec_ids) else np.nan, np.nan)
    return {"input_error": input_error, "amplification": amp}, suspects


def _records(dev_rows: Any) -> Any:
    """One row per device record (index ``d_record_id``, first-appearance order), taken from a row
    the device side has (a row of the bench side only carries its partner's record id and no
    device name: a compiled record's untraced eager input)."""
    named = dev_rows["device_name"].notna().to_numpy() if "device_name" in dev_rows else None
    if named is None or named.all():
        return dev_rows.drop_duplicates("d_record_id").set_index("d_record_id")
    first = dev_rows.drop_duplicates("d_record_id")["d_record_id"].to_numpy()
    pick = dev_rows.iloc[np.argsort(~named, kind="stable")].drop_duplicates("d_record_id").set_index("d_record_id")
    return pick.reindex(first)


def _flow(r: Any, err: np.ndarray, is_in: Any, is_out: Any, rec_ids: np.ndarray,
          fwd: np.ndarray, out_scale: Any = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """Carry one per-row error through the data flow: per record, its output error (for a
    device-only op, what its consumers see, scaled by ``out_scale[(record, output)]`` where given:
    an output ~0 by cancellation) and its input error (own, else its producer's output, plus what
    a backward record reads from its forward op); and the input rows with their error."""
    import pandas as pd

    r = r.assign(err=err)
    outs = r[is_out]
    out_err_row = outs.set_index(["rid", "arg"])["err"]
    out_err_row = out_err_row[~out_err_row.index.duplicated()]
    out_err = outs.groupby("rid")["err"].max()
    ins = r[is_in].copy()
    need = ins["err"].isna() & (ins["p_rid"] >= 0)
    if need.any():
        key = pd.MultiIndex.from_arrays([ins.loc[need, "p_rid"], ins.loc[need, "p_idx"]])
        via = out_err_row.reindex(key).to_numpy()
        via_rec = out_err.reindex(ins.loc[need, "p_rid"]).to_numpy()
        ins.loc[need, "err"] = np.where(np.isnan(via), via_rec, via)
    in_err = ins.groupby("rid")["err"].max()
    cons = ins[(ins["p_rid"] >= 0) & ins["err"].notna()]
    if out_scale is not None and len(cons):
        k = pd.MultiIndex.from_arrays([cons["p_rid"].to_numpy(), cons["p_idx"].astype(str).to_numpy()])
        cons = cons.assign(err=cons["err"].to_numpy() * out_scale.reindex(k).fillna(1.0).to_numpy())
    cons_err = cons.groupby("p_rid")["err"].max()
    o_err = out_err.reindex(rec_ids).to_numpy()
    o_err = np.where(np.isnan(o_err), cons_err.reindex(rec_ids).to_numpy(), o_err)
    i_err = in_err.reindex(rec_ids).to_numpy()
    # backward records also read the tensors their forward op saved (its inputs and outputs):
    # an error there is carried into the backward op, not introduced by it
    has_fwd = ~np.isnan(fwd)
    if has_fwd.any():
        saved = np.fmax(i_err, out_err.reindex(rec_ids).to_numpy())
        pos_of = pd.Series(np.arange(len(rec_ids)), index=rec_ids)
        j = pos_of.reindex(fwd[has_fwd]).to_numpy()
        carried = np.full(len(rec_ids), np.nan)
        ok = ~np.isnan(j)
        carried[np.flatnonzero(has_fwd)[ok]] = saved[j[ok].astype(int)]
        i_err = np.where(np.isnan(carried), i_err, np.fmax(i_err, carried))
    return o_err, i_err, ins
