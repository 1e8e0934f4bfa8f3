"""torchparity overflow checker: NaN / Inf / saturation, from the dump's statistics alone.

Levels, per op record (msprobe's overflow levels, computed vectorised over a whole dump):

``critical``
    every floating input is finite and an output is non-finite: the op that created the overflow.
``high``
    non-finite inputs and non-finite outputs (the overflow propagating), or finite tensors whose
    output norm explodes far beyond the input norm (``norm_ratio``).
``medium``
    non-finite inputs, finite outputs (absorbed by a ``where``/``masked_fill``/reduction...).

"Non-finite" means ``nan > 0`` or ``inf > 0`` or a non-finite max/min (mean/norm too when the
dump has no NaN/Inf counts, as in msprobe dumps: they are accumulated in float32 and may overflow
for finite values), and also
**saturation**: a float16/bfloat16 tensor whose ``max`` or ``min`` reaches the dtype's largest
finite value (65504 for float16) counts as overflowed, because saturating hardware (Ascend in
saturation mode, clamping casts) produces that instead of Inf. When the dump says the device ran
in saturation mode (``ctx.extra["saturation_dtypes"]``), float32 saturation counts too.

Steps whose gradients GradScaler found non-finite (``_amp_foreach_non_finite_check_and_unscale_``
saw Inf/NaN, or ``_amp_update_scale_`` received ``found_inf > 0``) are skipped by the scaler on
purpose: their backward/optimizer findings get level ``None``, ``amp_skipped = True`` and a reason
saying so, instead of blaming an op. Forward findings in such steps are still reported.

Non-finite values written on purpose are not overflow: an op with a ``-inf``/``finfo.min``
scalar argument (``masked_fill(causal_mask, -inf)``) and the ops that only carry such values on
(found through the dump's ``producer`` links, e.g. the ``softmax`` that absorbs the mask) get level
``None`` (option ``by_design``). A NaN scalar argument is no such intent: ``x * nan`` and
``fill_(nan)`` create the NaN and are blamed (the rule NanInfTracker follows).

**Absorbed or harmful** (the rule of the online NaN/Inf tracker, :mod:`torchparity.naninf_rule`,
applied by :mod:`.lineage` on the producer links): a creation site (``critical`` by the rule
above, or an op writing a NaN scalar such as ``out[..., 3] = nan``) is a finding only when its
NaN/Inf reaches a sink (a gradient, a parameter or optimizer state, the loss or code outside any
module, the model's output). One whose NaN/Inf is absorbed (T5's ``log(0)`` in the relative
position bucket, cast to integers) gets level ``None``, ``site = "absorbed"`` and a reason saying
so, and so do the records that only carry its values on. Column ``site`` says ``harmful``,
``absorbed`` or ``entered`` (a non-finite tensor that no op of the step produced reached a sink).

Uninitialised memory is never judged: ``empty``-like ops, and the overwritten ``self`` input of
``fill_``/``zero_``/``copy_``/random in-place ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from torchparity import hookimpl
from torchparity.errors import UsageError
from torchparity.naninf_rule import (ABSORBED, ABSORBED_REASON, AMP_UNSCALE_OP, AMP_UPDATE_OP, ENTERED, HARMFUL,
                                     gradscaler_found_inf)
from torchparity.plugin_types import CheckContext, Checker

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__version__ = "0.1.0"

LEVELS = ("critical", "high", "medium")
#: largest finite value per dtype name (no torch import needed)
DTYPE_MAX = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
}
#: dtypes where a value at the max always counts as overflow
ALWAYS_SATURATION = frozenset({"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})

#: ops whose outputs are uninitialised memory (matched on the op's base name)
EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
#: in-place ops whose input ``self`` (arg 0) is overwritten entirely, so its old value is irrelevant
OVERWRITE_OPS = frozenset({"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_",
                           "exponential_", "geometric_", "log_normal_", "cauchy_", "set_", "resize_"})
BY_DESIGN_REASON = ("non-finite (or dtype-max) values written on purpose by a -inf/NaN/finfo.min argument "
                    "(e.g. an attention mask), or carried on from such an op: not an overflow")
SKIPPED_REASON = "step skipped by GradScaler (found_inf: loss-scale overflow, expected with dynamic loss scaling; not a model bug)"


def op_base(op: "pd.Series") -> "pd.Series":
    """``aten.addmm.default`` -> ``addmm``; ``torch.nn.functional.gelu`` -> ``gelu``;
    ``torch.Tensor.fill_`` -> ``fill_``; a module class name stays as is."""
    parts = op.astype(str).str.split(".")
    is_aten = op.astype(str).str.contains(r"^(?:aten|npu|prims|c10d|_c10d_functional)\.", regex=True)
    aten_base = parts.str[1].fillna("")
    last = parts.str[-1].fillna("")
    return aten_base.where(is_aten, last)


class OverflowChecker(Checker):
    """Classifies ops as critical / high / medium overflow from dump statistics."""

    name = "overflow"
    scopes = frozenset({"dump", "compare"})
    description = "NaN/Inf/fp16-bf16 saturation: critical (finite in -> non-finite out), high, medium; GradScaler-aware"

    @dataclass
    class Options:
        #: ``high`` when output norm > norm_ratio * max(input norm, norm_floor) with finite tensors
        norm_ratio: float = 1e4
        #: floor of the input norm in that ratio (tiny or zero inputs do not make every op "explode")
        norm_floor: float = 1.0
        #: count a value at the dtype's max as overflow for float16/bfloat16/float8
        saturation: bool = True
        #: label GradScaler-skipped steps instead of blaming their backward ops
        amp_aware: bool = True
        #: do not report non-finite values the model writes on purpose (``masked_fill(mask, -inf)``,
        #: ``full(..., -inf)``, ``finfo.min`` masks) nor the ops that carry them on (data flow)
        by_design: bool = True

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        try:
            o.norm_ratio, o.norm_floor = float(o.norm_ratio), float(o.norm_floor)
        except (TypeError, ValueError):
            raise UsageError(f"checker 'overflow': norm_ratio and norm_floor must be numbers, got {o.norm_ratio!r}, {o.norm_floor!r}") from None
        if o.norm_ratio <= 1 or o.norm_floor < 0:
            raise UsageError("checker 'overflow': norm_ratio must be > 1 and norm_floor >= 0")

    # ---- per tensor -----------------------------------------------------------------------------
    def tensor_flags(self, frame: pd.DataFrame, saturation_dtypes: frozenset[str] = frozenset()) -> pd.DataFrame:
        """Per tensor row: ``nonfinite`` (NaN/Inf), ``saturated`` (at the dtype's max) and ``bad``."""
        import numpy as np
        import pandas as pd

        def num(col: str) -> pd.Series:
            if col not in frame.columns:
                return pd.Series(np.nan, index=frame.index, dtype="float64")
            return pd.to_numeric(frame[col], errors="coerce").astype("float64")

        nan_c, inf_c = num("nan").fillna(0), num("inf").fillna(0)
        mx, mn, mean, norm = num("max"), num("min"), num("mean"), num("norm")
        is_tensor = frame["kind"].fillna("tensor").eq("tensor") if "kind" in frame.columns else pd.Series(True, index=frame.index)
        has_stats = mx.notna() | mn.notna() | (nan_c > 0) | (inf_c > 0)
        stat_nonfinite = pd.Series(False, index=frame.index)
        # mean and norm are accumulated in float32: a norm of finite values near the dtype's max
        # overflows there. Trust them only when the NaN/Inf counts are absent (msprobe dumps).
        counted = num("nan").notna() | num("inf").notna()
        for s, always in ((mx, True), (mn, True), (mean, False), (norm, False)):
            bad_stat = s.notna() & ~np.isfinite(s.to_numpy(dtype="float64", na_value=0.0))
            stat_nonfinite |= bad_stat if always else bad_stat & ~counted
        nonfinite = is_tensor & ((nan_c > 0) | (inf_c > 0) | stat_nonfinite)
        dtype = frame["dtype"].astype("string").fillna("") if "dtype" in frame.columns else pd.Series("", index=frame.index)
        limit = dtype.map(DTYPE_MAX).astype("float64")
        sat_ok = dtype.isin(ALWAYS_SATURATION if self.options.saturation else frozenset()) | dtype.isin(saturation_dtypes)
        absmax = pd.concat([mx.abs(), mn.abs()], axis=1).max(axis=1)
        saturated = is_tensor & sat_ok & limit.notna() & (absmax >= limit) & ~nonfinite
        return pd.DataFrame(
            {"nonfinite": nonfinite, "saturated": saturated, "bad": nonfinite | saturated,
             "judged": is_tensor & has_stats, "norm": norm, "absmax": absmax},
            index=frame.index,
        )

    # ---- single dump ------------------------------------------------------------------------------
    def scan_dump(self, frame: pd.DataFrame, ctx: CheckContext | None = None) -> pd.DataFrame:
        """One row per record: ``step, rank, record_id, name, op, module, phase, level, reason,
        amp_skipped`` plus ``stack`` when the frame has it. ``level`` is None for clean records."""
        import numpy as np
        import pandas as pd

        ctx = ctx or CheckContext()
        required = {"record_id", "op", "io"}
        missing = required - set(frame.columns)
        if missing:
            raise UsageError(f"overflow: the dump table lacks column(s) {', '.join(sorted(missing))}; is it a torchparity.load_dump() frame?")
        out_cols = ["step", "rank", "record_id", "name", "op", "module", "phase", "level", "reason", "amp_skipped", "stack",
                    "site"]
        if frame.empty:
            return pd.DataFrame(columns=out_cols)
        f = frame.copy()
        for col, default in (("step", 0), ("rank", 0), ("name", ""), ("module", ""), ("phase", "forward"), ("arg", ""),
                             ("stack", None), ("module_class", None)):
            if col not in f.columns:
                f[col] = default
        sat_dtypes = frozenset(ctx.extra.get("saturation_dtypes", ()) or ())
        flags = self.tensor_flags(f, sat_dtypes)
        base = op_base(f["op"])
        ignored_op = base.isin(EMPTY_OPS)
        overwritten = base.isin(OVERWRITE_OPS) & f["io"].eq("input") & f["arg"].astype(str).isin(["0", "self"])
        judged = flags["judged"] & ~ignored_op & ~overwritten
        is_in = f["io"].isin(["input", "param"])
        is_out = f["io"].eq("output")
        t = pd.DataFrame({
            "step": f["step"], "rank": f["rank"], "record_id": f["record_id"],
            "in_bad": judged & is_in & flags["bad"], "out_bad": judged & is_out & flags["bad"],
            "out_nf": judged & is_out & flags["nonfinite"], "out_sat": judged & is_out & flags["saturated"],
            "in_n": (judged & is_in).astype(int), "out_n": (judged & is_out).astype(int),
            "in_norm": flags["norm"].where(judged & is_in & ~flags["bad"]),
            "out_norm": flags["norm"].where(judged & is_out & ~flags["bad"]),
            "in_amax": flags["absmax"].where(judged & is_in & ~flags["bad"]),
            "out_amax": flags["absmax"].where(judged & is_out & ~flags["bad"]),
            "ignored": ignored_op,
        })
        keys = ["step", "rank", "record_id"]
        g = t.groupby(keys, sort=False, dropna=False)
        agg = g.agg(in_bad=("in_bad", "any"), out_bad=("out_bad", "any"), out_nf=("out_nf", "any"),
                    out_sat=("out_sat", "any"), in_n=("in_n", "sum"), out_n=("out_n", "sum"),
                    in_norm=("in_norm", "max"), out_norm=("out_norm", "max"), in_amax=("in_amax", "max"),
                    out_amax=("out_amax", "max"), ignored=("ignored", "any"))
        first = f.groupby(keys, sort=False, dropna=False)[["name", "op", "module", "phase", "stack"]].first()
        rec = agg.join(first).reset_index()

        o = self.options
        critical = rec["out_bad"] & ~rec["in_bad"]
        high_prop = rec["out_bad"] & rec["in_bad"]
        ratio = rec["out_norm"] / np.maximum(rec["in_norm"].fillna(0.0), o.norm_floor)
        # a norm of finite values near the dtype's limit overflows when accumulated (a
        # where(mask, 0, finfo.min) mask): compare the largest magnitudes instead
        big = np.isinf(rec["out_norm"].to_numpy(dtype="float64", na_value=np.nan))
        amax_ratio = rec["out_amax"] / np.maximum(rec["in_amax"].fillna(0.0), o.norm_floor)
        ratio = ratio.where(~big, amax_ratio)
        explode = ~rec["out_bad"] & ~rec["in_bad"] & rec["in_norm"].notna() & (ratio > o.norm_ratio)
        medium = rec["in_bad"] & ~rec["out_bad"]
        level = np.select([critical, high_prop | explode, medium], ["critical", "high", "medium"], default=None)
        rec["level"] = pd.Series(level, index=rec.index, dtype="object").where(~rec["ignored"], None)

        what_out = np.where(rec["out_nf"], "NaN/Inf", "saturated at the dtype's max value")
        reason = np.select(
            [critical, high_prop, explode, medium],
            [
                pd.Series("finite inputs, output " + pd.Series(what_out, index=rec.index) + ": this op overflowed"),
                pd.Series("non-finite inputs and outputs: overflow propagated from an earlier op", index=rec.index),
                "output norm " + rec["out_norm"].map("{:.4g}".format) + " is " + ratio.map("{:.3g}".format)
                + "x the input norm " + rec["in_norm"].map("{:.4g}".format),
                pd.Series("non-finite inputs, finite outputs: overflow absorbed here", index=rec.index),
            ],
            default="",
        )
        rec["reason"] = pd.Series(reason, index=rec.index).where(rec["level"].notna(), "")
        design: set[tuple[Any, Any, Any]] = set()
        if o.by_design:
            design = self.by_design_records(f, flags, judged & is_in, rec)
            if design:
                hit = pd.Series(list(zip(rec["step"], rec["rank"], rec["record_id"])), index=rec.index).isin(design)
                hit &= rec["level"].notna()
                rec.loc[hit, "reason"] = BY_DESIGN_REASON
                rec.loc[hit, "level"] = None
        self._apply_lineage(f, flags, judged, design, rec)
        rec["amp_skipped"] = False
        if o.amp_aware:
            skipped = self.gradscaler_skipped_steps(f, flags)
            if skipped:
                in_skipped = pd.Series(list(zip(rec["step"], rec["rank"])), index=rec.index).isin(skipped)
                grad_side = rec["phase"].isin(["backward", "optimizer"]) | base_of(rec["op"]).isin([AMP_UNSCALE_OP, AMP_UPDATE_OP])
                hit = in_skipped & grad_side & rec["level"].notna()
                rec.loc[hit, "reason"] = SKIPPED_REASON + " [" + rec.loc[hit, "level"].astype(str) + ": " + rec.loc[hit, "reason"] + "]"
                rec.loc[hit, "level"] = None
                rec.loc[in_skipped & grad_side, "amp_skipped"] = True
        return rec[out_cols]

    def _apply_lineage(self, f: pd.DataFrame, flags: pd.DataFrame, judged: pd.Series, design: set[tuple[Any, Any, Any]],
                       rec: pd.DataFrame) -> None:
        """Creation sites harmful or absorbed (see :mod:`.lineage`): fills ``rec["site"]`` and
        moves absorbed sites, and records carrying only absorbed sites' values, to level None."""
        import pandas as pd

        from .lineage import trace

        rec["site"] = None
        status = trace(f, flags["bad"], judged, design)
        if not status:
            return
        keys = list(zip(rec["step"], rec["rank"], rec["record_id"]))
        absorbed = {k for k, st in status.items() if st.status == ABSORBED}
        names = dict(zip(keys, rec["name"]))
        level, reason, site = rec["level"].tolist(), rec["reason"].tolist(), [None] * len(rec)
        for i, k in enumerate(keys):
            st = status.get(k)
            if st is None:
                continue
            if st.status == HARMFUL:
                site[i], level[i] = HARMFUL, "critical"
                if not reason[i] or not reason[i].startswith("finite inputs"):
                    reason[i] = ("a NaN scalar argument (x * nan, fill_(nan), out[...] = nan) made its output NaN: "
                                 "this op created the NaN")
                if st.possible:
                    reason[i] += (" (possibly harmful: a NaN/Inf whose origin the dump's producer links do not show "
                                  "reached a gradient, parameter, the loss or the output)")
            elif st.status == ABSORBED:
                site[i], level[i], reason[i] = ABSORBED, None, ABSORBED_REASON
            elif st.status == ENTERED:
                site[i] = ENTERED
                reason[i] = ("read a NaN/Inf that no op of this step produced (a parameter, a batch, a value from an "
                             "earlier step), and it reached a gradient, parameter, the loss or the output")
            elif level[i] is not None and st.carries and st.carries <= absorbed and not st.unknown:
                first = min(st.carries, key=lambda x: x[2])
                level[i] = None
                reason[i] = f"carries the NaN/Inf of absorbed site {names.get(first, first)} (information)"
        rec["level"] = pd.Series(level, index=rec.index, dtype="object")
        rec["reason"] = reason
        rec["site"] = pd.Series(site, index=rec.index, dtype="object")

    def by_design_records(self, f: pd.DataFrame, flags: pd.DataFrame, judged_in: pd.Series,
                          rec: pd.DataFrame) -> set[tuple[Any, Any, Any]]:
        """``{(step, rank, record_id)}`` of records whose non-finite values are intended.

        A record is *by design* when a scalar argument is infinite or at least the largest
        finite value of its output dtype (``masked_fill(mask, float("-inf"))``, ``full(-inf)``,
        ``masked_fill(mask, torch.finfo(dtype).min)``) and none of its non-finite tensor inputs comes
        from an op that is not by design; or when every non-finite tensor input was produced (per
        the dump's ``producer`` links) by a by-design record (``softmax`` of masked scores). Without
        producer links (msprobe dumps) only the first rule applies.
        """
        import math

        import pandas as pd

        if "kind" not in f.columns or "value" not in f.columns:
            return set()
        cand = rec[rec["in_bad"] | rec["out_bad"]]
        if cand.empty:
            return set()
        # per record: the smallest dtype max among its floating outputs
        out_rows = f[f["io"].eq("output")]
        out_limit = out_rows["dtype"].astype("string").map(DTYPE_MAX).astype("float64")
        limit_by_rec = out_limit.groupby([out_rows["step"], out_rows["rank"], out_rows["record_id"]]).min().to_dict()
        scalars = f[f["kind"].eq("scalar") & f["io"].eq("input")]
        extreme: set[tuple[Any, Any, Any]] = set()
        for step, rank, rid, value in zip(scalars["step"], scalars["rank"], scalars["record_id"], scalars["value"]):
            try:
                v = float(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                continue
            if v is None:
                continue
            key = (step, rank, rid)
            lim = limit_by_rec.get(key)
            # a NaN scalar creates NaN (``x * nan``, ``fill_(nan)``): never by design (issue 14)
            if math.isinf(v) or (lim is not None and not math.isnan(lim) and abs(v) >= lim):
                extreme.add(key)
        bad_in = f[judged_in & flags["bad"]]
        producers: dict[tuple[Any, Any, Any], list[Any]] = {}
        prod_col = bad_in["producer"] if "producer" in bad_in.columns else pd.Series(None, index=bad_in.index)
        for step, rank, rid, prod in zip(bad_in["step"], bad_in["rank"], bad_in["record_id"], prod_col):
            producers.setdefault((step, rank, rid), []).append(prod)
        design: set[tuple[Any, Any, Any]] = set()
        for step, rank, rid in cand.sort_values(["step", "rank", "record_id"])[["step", "rank", "record_id"]].itertuples(index=False, name=None):
            key = (step, rank, rid)
            prods = producers.get(key, [])
            from_design = all(
                isinstance(p, (tuple, list)) and len(p) == 2 and (step, rank, int(p[0])) in design for p in prods
            )
            if (key in extreme or prods) and from_design:
                design.add(key)
        return design

    def gradscaler_skipped_steps(self, frame: pd.DataFrame, flags: pd.DataFrame | None = None) -> set[tuple[Any, Any]]:
        """``{(step, rank)}`` where GradScaler found Inf/NaN gradients (and so skipped the step)."""
        if flags is None:
            flags = self.tensor_flags(frame)
        import pandas as pd

        mx = pd.to_numeric(frame["max"], errors="coerce") if "max" in frame.columns else pd.Series(0.0, index=frame.index)
        arg = frame["arg"].astype(str) if "arg" in frame.columns else pd.Series("", index=frame.index)
        found = gradscaler_found_inf(op_base(frame["op"]).to_numpy(dtype=object), frame["io"].to_numpy(dtype=object),
                                     arg.to_numpy(dtype=object), mx.to_numpy(dtype="float64"),
                                     flags["nonfinite"].to_numpy(dtype=bool))
        hit = frame.loc[found, ["step", "rank"]]
        return set(map(tuple, hit.drop_duplicates().itertuples(index=False, name=None)))

    # ---- comparison -------------------------------------------------------------------------------
    def judge_rows(self, rows: pd.DataFrame, ctx: CheckContext | None = None) -> pd.DataFrame:
        """``error`` where the device has NaN/Inf (or fp16/bf16 saturation) the bench does not;
        ``warning`` where only the bench does; ``skip`` otherwise: both non-finite (not
        device-specific), no statistics, or no overflow - which says nothing about whether the
        values agree (a ``pass`` here would pass rows no tolerance checker looked at)."""
        import numpy as np
        import pandas as pd

        n = len(rows)

        def side(prefix: str, saturation: bool = True) -> tuple[np.ndarray, np.ndarray]:
            def num(col: str) -> np.ndarray:
                c = f"{prefix}_{col}"
                if c not in rows.columns:
                    return np.full(n, np.nan)
                v = rows[c]
                if v.dtype.kind != "f":
                    v = pd.to_numeric(v, errors="coerce")
                return v.to_numpy(dtype="float64", na_value=np.nan)

            nan_c, inf_c, mx, mn = num("nan"), num("inf"), num("max"), num("min")
            known = ~np.isnan(nan_c) | ~np.isnan(inf_c) | ~np.isnan(mx) | ~np.isnan(mn)
            # NaN counts/extremes: a NaN statistic is "not recorded", an infinite one is overflow
            bad = (nan_c > 0) | (inf_c > 0) | np.isinf(mx) | np.isinf(mn)
            dcol = f"{prefix}_dtype"
            if saturation and self.options.saturation and dcol in rows.columns:
                # the dtype's max, looked up once per distinct dtype
                codes, uniq = pd.factorize(rows[dcol].to_numpy(dtype=object), use_na_sentinel=False)
                lim = np.array([DTYPE_MAX.get(u, np.nan) if isinstance(u, str) and u in ALWAYS_SATURATION
                                else np.nan for u in uniq] + [np.nan], dtype="float64")[codes]
                # an extreme that is a sentinel pair (finfo(dtype).min of a mask on both sides,
                # the compare core's max_sentinel/min_sentinel columns) is no saturation
                if "max_sentinel" in rows.columns:
                    mx = np.where(rows["max_sentinel"].fillna(False).to_numpy(dtype=bool), np.nan, mx)
                if "min_sentinel" in rows.columns:
                    mn = np.where(rows["min_sentinel"].fillna(False).to_numpy(dtype=bool), np.nan, mn)
                with np.errstate(invalid="ignore"):
                    absmax = np.fmax(np.abs(mx), np.abs(mn))
                    bad |= ~np.isnan(lim) & (absmax >= lim)
            return bad, known

        d_bad, d_known = side("device")
        b_bad, b_known = side("bench")
        # a value exactly at finfo(dtype).max on a record the bench does not have (a device-only
        # cast of autocast's fp16 mask: -65504) cannot be told from a mask sentinel: only NaN/Inf
        # count there (fp16/bf16 overflow rounds to Inf, it never stops at the max)
        if "device_nan" in rows.columns or "device_inf" in rows.columns:
            nf_only, _ = side("device", saturation=False)
            d_bad = np.where(b_known, d_bad, nf_only)
        verdict = np.select(
            [~d_known, d_bad & ~b_bad, ~d_bad & b_bad, d_bad & b_bad],
            ["skip", "error", "warning", "skip"], default="skip").astype(object)
        reason = np.select(
            [~d_known, d_bad & ~b_bad, ~d_bad & b_bad, d_bad & b_bad],
            ["no statistics to judge overflow",
             "device has NaN/Inf (or saturated fp16/bf16) values the benchmark does not",
             "benchmark has NaN/Inf values the device does not",
             "both sides non-finite: overflow is not device-specific"], default="").astype(object)
        return pd.DataFrame({"verdict": pd.Series(verdict, index=rows.index, dtype=object),
                             "reason": pd.Series(reason, index=rows.index, dtype=object)})


def base_of(op: "pd.Series") -> "pd.Series":
    """Alias of :func:`op_base` for readability at call sites."""
    return op_base(op)


@hookimpl
def torchparity_checkers():
    yield OverflowChecker()
