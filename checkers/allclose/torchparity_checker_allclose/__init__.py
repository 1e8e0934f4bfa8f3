"""torchparity checker ``allclose``: dtype-aware tolerances.

Offline compare (``judge_rows``): each tensor row is judged against the tolerance of the
lower-precision dtype of the pair (a bf16 device compared with an fp32 benchmark is judged
against bf16 rounding, never flagged as "dtype inconsistent"):

* ``error``: NaN/Inf positions differ; shapes differ; a scalar argument differs; or an output
  whose error exceeds ``error_factor`` x rtol *and* is ``amplification`` x larger than its
  op's input error (the op introduced it);
* ``warning``: an error above the tolerance that was carried in from the inputs;
* ``pass`` otherwise; ``skip`` for unmatched rows and rows without metrics.

Online compare (``check_tensors``): with a same-dtype reference and a high-precision reference,
fail only when the device's error against the high-precision reference exceeds ``k`` times the
same-dtype reference's error (k = 2, 3 for fp16/bf16); without them, fall back to
``torch.allclose``-style dtype tolerances.

Options (plugins.yaml)::

    checkers:
      - allclose:
          rtol: {bfloat16: 0.02}          # per-dtype overrides of the defaults below
          atol: {bfloat16: 1.0e-5}
          overrides:                      # per op pattern (fnmatch on op or record name)
            - {op: "aten.softmax*", dtype: bfloat16, rtol: 0.05}
          error_factor: 2.0
          amplification: 10.0
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from torchparity import hookimpl
from torchparity.compare.metrics import factorize_shapes
from torchparity.errors import PluginError
from torchparity.plugin_types import CheckContext, Checker, CheckResult

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import torch

__version__ = "0.1.0"

#: torch.testing.assert_close defaults
DEFAULT_RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2, "float32": 1.3e-6, "float64": 1e-7,
                "complex64": 1.3e-6, "complex128": 1e-7, "float8_e4m3fn": 1.25e-1, "float8_e5m2": 2.5e-1}
DEFAULT_ATOL = {"float16": 1e-5, "bfloat16": 1e-5, "float32": 1e-5, "float64": 1e-7,
                "complex64": 1e-5, "complex128": 1e-7, "float8_e4m3fn": 1e-3, "float8_e5m2": 1e-3}
#: unit roundoff per dtype (half an ulp at 1): the smallest meaningful relative error
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53,
                 "float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}
PRECISION_ORDER = ["float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "float32", "complex64", "float64", "complex128"]
LOW_PRECISION = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def lower_precision(d: Any, b: Any) -> str:
    """The lower-precision floating dtype name of a pair (float32 when neither is floating)."""
    c = [x for x in (d, b) if isinstance(x, str) and x in DEFAULT_RTOL]
    if not c:
        return "float32"
    return min(c, key=lambda x: PRECISION_ORDER.index(x))


class AllcloseChecker(Checker):
    """Dtype-aware tolerance checks for offline and online compare."""

    name = "allclose"
    scopes = frozenset({"compare", "online"})
    description = "dtype-aware tolerances (torch.testing defaults), amplification-aware verdicts"

    @dataclass
    class Options:
        #: per-dtype relative tolerance overrides, e.g. {"bfloat16": 0.02}
        rtol: dict = field(default_factory=dict)
        #: per-dtype absolute tolerance overrides
        atol: dict = field(default_factory=dict)
        #: per-op overrides: list of {op: pattern, dtype: optional, rtol: ..., atol: ...}
        overrides: list = field(default_factory=list)
        #: an error above error_factor x rtol is beyond the dtype's tolerance
        error_factor: float = 2.0
        #: ... and is an error when it is this many times the op's input error
        amplification: float = 10.0
        #: online: allowed ratio of device error to same-dtype reference error
        k: float = 2.0
        #: online: that ratio for fp16/bf16/fp8
        k_low_precision: float = 3.0

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        for name in ("rtol", "atol"):
            val = getattr(o, name)
            if not isinstance(val, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in val.values()):
                raise PluginError(f"checker 'allclose': option {name} must map dtype names to non-negative numbers, got {val!r}")
        if not isinstance(o.overrides, list) or not all(isinstance(x, dict) and "op" in x for x in o.overrides):
            raise PluginError("checker 'allclose': overrides must be a list of {op: pattern, rtol: .., atol: .., dtype: ..}")
        if o.amplification <= 1 or o.error_factor <= 0 or o.k <= 1 or o.k_low_precision <= 1:
            raise PluginError("checker 'allclose': amplification, k and k_low_precision must be > 1, error_factor > 0")

    # ---- tolerances -----------------------------------------------------------------------
    def tolerance(self, dtype: str, op: str = "", name: str = "") -> tuple[float, float]:
        """(rtol, atol) for a dtype and op, after per-dtype and per-op overrides."""
        rtol = float(self.options.rtol.get(dtype, DEFAULT_RTOL.get(dtype, DEFAULT_RTOL["float32"])))
        atol = float(self.options.atol.get(dtype, DEFAULT_ATOL.get(dtype, DEFAULT_ATOL["float32"])))
        for ov in self.options.overrides:
            pat = str(ov["op"])
            if ov.get("dtype") not in (None, dtype):
                continue
            if fnmatch.fnmatchcase(op, pat) or (name and fnmatch.fnmatchcase(name, pat)):
                rtol = float(ov.get("rtol", rtol))
                atol = float(ov.get("atol", atol))
        return rtol, atol

    def _configured(self) -> bool:
        """Whether the user set tolerances of their own (rtol, atol or per-op overrides)."""
        o = self.options
        return bool(o.rtol or o.atol or o.overrides)

    # ---- offline ----------------------------------------------------------------------------
    def judge_rows(self, rows: pd.DataFrame, ctx: CheckContext | None = None) -> pd.DataFrame:
        import numpy as np
        import pandas as pd

        n = len(rows)

        def col(c: str, default: Any = np.nan) -> Any:
            return rows[c] if c in rows.columns else pd.Series(default, index=rows.index)

        def text(c: str, default: str) -> np.ndarray:
            """A text column as an object array of ``str`` (as ``astype(str)``, without building
            pandas' string dtype: one conversion per distinct value when some are not strings)."""
            if c not in rows.columns:
                return np.full(n, default, dtype=object)
            a = rows[c].to_numpy(dtype=object)
            if set(map(type, a)) <= {str}:
                return a
            codes, uniq = pd.factorize(a, use_na_sentinel=False)
            return np.array([str(u) for u in uniq] + [""], dtype=object)[codes]

        verdict = np.full(n, "skip", dtype=object)
        reason = np.full(n, "", dtype=object)
        dd, bd = col("device_dtype", None).to_numpy(dtype=object), col("bench_dtype", None).to_numpy(dtype=object)
        ops = text("op", "")
        names = text("device_name", "") if self.options.overrides else np.full(n, "", dtype=object)
        use_names = bool(self.options.overrides)
        # core sets judge_dtype (the pair's lower precision, or the precision an emulating device
        # computed in); without it, the lower precision of the two dtypes
        jd = col("judge_dtype", None).to_numpy(dtype=object)
        # one tolerance lookup per distinct (dtypes, op[, name]) combination
        # factorize each key column in C and combine the codes (same groups as the string keys)
        key = np.zeros(n, dtype=np.int64)
        for part in ((dd, bd, jd, ops, names) if use_names else (dd, bd, jd)):
            c, u = pd.factorize(part, use_na_sentinel=False)
            key = key * (len(u) + 1) + c
        _, first, codes = np.unique(key, return_index=True, return_inverse=True)
        codes = codes.reshape(-1)
        u_rtol, u_atol, u_dt = np.empty(len(first)), np.empty(len(first)), np.empty(len(first), dtype=object)
        for k, i in enumerate(first):
            dt = jd[i] if isinstance(jd[i], str) and jd[i] in DEFAULT_RTOL else lower_precision(dd[i], bd[i])
            u_rtol[k], u_atol[k] = self.tolerance(dt, ops[i], names[i] if use_names else "")
            u_dt[k] = dt
        rtol, atol, dtypes = u_rtol[codes], u_atol[codes], u_dt[codes]
        kind = text("kind", "tensor")
        io = text("io", "")
        matched = text("match", "exact") != "unmatched"
        rel_l2 = col("rel_l2").to_numpy(dtype="float64")
        stat_err = col("stat_error").to_numpy(dtype="float64")
        err = np.where(np.isnan(rel_l2), stat_err, rel_l2)
        in_err_raw = col("input_error").to_numpy(dtype="float64")
        in_err = np.nan_to_num(in_err_raw, nan=0.0, posinf=np.inf)
        # no known inputs (parameter gradients, records without input links): cannot be "introduced here"
        no_inputs = np.isnan(in_err_raw) & (ops == "parameters_grad")
        norm = np.abs(col("bench_norm").to_numpy(dtype="float64"))
        shapes = col("bench_shape", None).to_numpy(dtype=object)
        numel = _numel(shapes)
        with np.errstate(divide="ignore", invalid="ignore"):
            atol_rel = np.where(norm > 0, atol * np.sqrt(np.nan_to_num(numel, nan=1.0, posinf=np.inf, neginf=-np.inf)) / norm, np.inf)
        limit = self.options.error_factor * rtol + np.nan_to_num(atol_rel, nan=0.0, posinf=np.inf, neginf=-np.inf)
        is_tensor = (kind == "tensor") & matched
        has = is_tensor & ~np.isnan(err)
        out_like = (io == "output") | (io == "grad")
        beyond = has & (err > limit)
        # "introduced here" is the root-cause analysis' own test: output error over input error,
        # with the same noise floor (the compare core's `floor` column), so that verdicts and the
        # root cause never disagree; without that column, the tolerance stands in for the floor
        floor = col("floor").to_numpy(dtype="float64")
        floor = np.where(np.isnan(floor), limit, floor)
        amp = col("amplification").to_numpy(dtype="float64")
        if "amplification" in rows.columns:
            # the core's error model scored each op (two channels, op families): its score is the
            # amplification, so that a verdict never contradicts the root cause
            amplified = np.nan_to_num(amp, nan=0.0, posinf=np.inf) >= self.options.amplification
        else:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                amplified = (err >= self.options.amplification * np.fmax(in_err, floor)) & ~no_inputs
        if not self._configured():
            # default tolerances: an output the error model finds amplified is beyond them even
            # when an elementwise atol (1e-5, large next to a small gradient) would pass it; a
            # tolerance the user configured keeps the last word
            beyond = beyond | (has & amplified & out_like & (err > 0))
        verdict[has] = "pass"
        w = beyond & ~(out_like & amplified)
        verdict[w] = "warning"
        reason[w] = [(f"differs by {e:.3g} (> {l:.3g} for {dt}), carried from its inputs (input error {ie:.3g})"
                      if e <= 2 * ie else f"differs by {e:.3g} (> {l:.3g} for {dt}) (a gradient: see the backward ops that produced it)"
                      if ie == 0 else
                      f"differs by {e:.3g} (> {l:.3g} for {dt}), more than its inputs (input error {ie:.3g}) "
                      f"but below the root-cause amplification")
                     if o else f"input differs by {e:.3g} (> {l:.3g} for {dt})"
                     # Python floats: formatting numpy scalars is slower (same text)
                     for e, l, dt, ie, o in zip(err[w].tolist(), limit[w].tolist(), dtypes[w].tolist(),
                                                in_err[w].tolist(), out_like[w].tolist())]
        e_ = beyond & out_like & amplified
        verdict[e_] = "error"
        reason[e_] = [(f"output differs by {e:.3g} (> {l:.3g} for {dt}) while its inputs differ by {ie:.3g}: "
                       f"introduced here") if e > l else
                      (f"output differs by {e:.3g} while its inputs differ by {ie:.3g}: amplified {a:.3g}x by the "
                       f"{dt} error model (within the elementwise tolerance {l:.3g}): introduced here")
                      for e, l, dt, ie, a in zip(err[e_].tolist(), limit[e_].tolist(), dtypes[e_].tolist(),
                                                 in_err[e_].tolist(), np.nan_to_num(amp[e_], nan=0.0).tolist())]
        # shape, NaN/Inf, scalar arguments
        ds, bs = col("device_shape", None).to_numpy(dtype=object), col("bench_shape", None).to_numpy(dtype=object)
        shape_bad = is_tensor & _shapes_differ(ds, bs)
        verdict[shape_bad] = "error"
        reason[shape_bad] = [f"shape differs: device {a}, bench {b}" for a, b in zip(ds[shape_bad], bs[shape_bad])]
        nf = is_tensor & col("nonfinite_mismatch", False).fillna(False).to_numpy(dtype=bool)
        verdict[nf] = "error"
        reason[nf] = "NaN/Inf positions differ from the benchmark"
        sc = (kind == "scalar") & matched
        vd = sc & col("value_differs", False).fillna(False).to_numpy(dtype=bool)
        verdict[sc] = "pass"
        verdict[vd] = "error"
        if vd.any():
            dv, bv = col("device_value", None).to_numpy(dtype=object), col("bench_value", None).to_numpy(dtype=object)
            reason[vd] = [f"argument value differs: device {a!r}, bench {b!r}" for a, b in zip(dv[vd], bv[vd])]
        return _verdicts(verdict, reason, rows.index)

    # ---- online -----------------------------------------------------------------------------
    def check_tensors(self, device: torch.Tensor, reference: torch.Tensor, ctx: CheckContext | None = None,
                      reference_same_dtype: torch.Tensor | None = None, reference_high: torch.Tensor | None = None,
                      **kw: Any) -> CheckResult:
        """Judge one device output. ``reference`` is the reference backend's output;
        ``reference_same_dtype`` a reference computed in the device's dtype and ``reference_high``
        one computed in high precision (both optional)."""
        import torch

        ctx = ctx or CheckContext(mode="online")
        dtype = str(device.dtype).replace("torch.", "")
        d = device.detach().cpu()
        if tuple(d.shape) != tuple(reference.shape):
            return CheckResult(self.name, "error", f"shape differs: device {tuple(d.shape)}, reference {tuple(reference.shape)}",
                               {"dtype": dtype})
        if not (d.dtype.is_floating_point or d.is_complex()):
            equal = bool(torch.equal(d, reference.detach().cpu().to(d.dtype)))
            return CheckResult(self.name, "pass" if equal else "error", "" if equal else "integer/bool values differ",
                               {"dtype": dtype})
        high = (reference_high if reference_high is not None else reference).detach().cpu().to(torch.float64)
        d64 = d.to(torch.float64)
        differ = _nonfinite_differ(d64, high)
        if bool(differ.any()) and reference_same_dtype is not None:
            # a value past the dtype's range is +-inf on every device of that dtype (a float32
            # finfo.min mask constant in bfloat16): where the same-dtype reference is non-finite
            # in the same way, the device rounded as it should
            same = reference_same_dtype.detach().cpu().to(torch.float64)
            if tuple(same.shape) == tuple(d64.shape):
                differ &= _nonfinite_differ(d64, same)
        if bool(differ.any()):
            return CheckResult(self.name, "error", "NaN/Inf positions differ from the reference", {"dtype": dtype})
        fin = torch.isfinite(high) & torch.isfinite(d64)
        err_dev = _rel_l2(d64[fin], high[fin])
        metrics: dict[str, Any] = {"dtype": dtype, "device_error": err_dev}
        if reference_same_dtype is not None and reference_high is not None:
            s64 = reference_same_dtype.detach().cpu().to(torch.float64)
            fs = fin & torch.isfinite(s64) if tuple(s64.shape) == tuple(fin.shape) else fin
            err_same = _rel_l2(s64[fs], high[fs])
            k = self.options.k_low_precision if dtype in LOW_PRECISION else self.options.k
            floor = UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"])
            allowed = k * max(err_same, floor)
            metrics.update(reference_error=err_same, allowed=allowed, k=k)
            if err_dev > allowed:
                return CheckResult(self.name, "error",
                                   f"error vs high-precision reference {err_dev:.3g} > {k:g} x the same-dtype reference's "
                                   f"{err_same:.3g}", metrics)
            return CheckResult(self.name, "pass", "", metrics)
        rtol, atol = self.tolerance(dtype, ctx.op)
        diff = (d64 - high).abs()
        bad = (diff > atol + rtol * high.abs()) & fin
        nbad = int(bad.sum())
        metrics.update(rtol=rtol, atol=atol, mismatched=nbad, max_abs_err=float(diff[fin].max()) if bool(fin.any()) else 0.0)
        if nbad:
            return CheckResult(self.name, "error", f"{nbad} of {d.numel()} elements outside rtol={rtol:g} atol={atol:g} "
                               f"({dtype})", metrics)
        return CheckResult(self.name, "pass", "", metrics)


def _nonfinite_differ(a: Any, b: Any) -> Any:
    """Per element: ``a`` and ``b`` are not NaN, +inf or -inf alike."""
    import torch

    return (torch.isnan(a) != torch.isnan(b)) | (torch.isinf(a) != torch.isinf(b)) \
        | (torch.isinf(a) & torch.isinf(b) & (torch.sign(a) != torch.sign(b)))


def _verdicts(verdict: Any, reason: Any, index: Any) -> Any:
    """The checker's answer: ``verdict``/``reason`` object columns (pandas >= 3 would infer its
    slower ``str`` dtype from object arrays of strings)."""
    import pandas as pd

    return pd.DataFrame({"verdict": pd.Series(verdict, index=index, dtype=object),
                         "reason": pd.Series(reason, index=index, dtype=object)})


def _numel(shapes: Any) -> Any:
    """Elements per shape tuple (NaN where the shape is unknown), one product per distinct shape."""
    import numpy as np
    import pandas as pd

    arr = pd.Series(list(shapes), dtype=object).to_numpy()
    if not len(arr):
        return np.empty(0, dtype="float64")
    codes, uniq = factorize_shapes(arr)
    vals = np.array([float(math.prod(s)) if isinstance(s, tuple) else np.nan for s in uniq] + [np.nan], dtype="float64")
    return vals[codes]


def _shapes_differ(ds: Any, bs: Any) -> Any:
    """Per row: both shapes are known tuples and they differ."""
    import numpy as np
    import pandas as pd

    n = len(ds)
    if not n:
        return np.zeros(0, dtype=bool)
    both = pd.Series(list(ds) + list(bs), dtype=object).to_numpy()
    codes, uniq = factorize_shapes(both)
    is_tuple = np.array([isinstance(u, tuple) for u in uniq] + [False], dtype=bool)
    cd, cb = codes[:n], codes[n:]
    return is_tuple[cd] & is_tuple[cb] & (cd != cb)


def _rel_l2(a: Any, b: Any) -> float:
    import torch

    if a.numel() == 0:
        return 0.0
    nb = float(torch.linalg.vector_norm(b))
    nd = float(torch.linalg.vector_norm(a - b))
    if nb == 0.0:
        return 0.0 if nd == 0.0 else math.inf
    return nd / nb


@hookimpl
def torchparity_checkers():
    yield AllcloseChecker()
