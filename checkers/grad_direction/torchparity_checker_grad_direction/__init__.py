"""torchparity checker ``grad_direction``: judges gradient direction drift between two runs.

Scope ``grads``: :func:`torchparity.gradients.compare_runs` hands it one row per (rank, step,
parameter) with the cosine and sign agreement of the two runs' direction sketches, the gradient
norms and their share of the step's largest gradient norm; it returns a verdict per row:

* ``error`` (drift): cosine below ``min_cosine``, or NaN/Inf in one run's gradient and not in the
  other's, or a gradient present (non-zero) in one run and exactly zero in the other;
* ``warning``: cosine below ``warn_cosine``;
* ``skip``: both gradients are below ``min_norm_share`` of the step's largest gradient norm. A
  gradient that small has no meaningful direction (e.g. a bias whose gradient is structurally
  ~1e-10): comparing its signs gives noise, which made msprobe's grad_probe flag every run;
* ``pass`` otherwise.

Defaults: drift below cosine 0.99 (an angle of 8 degrees), warning below 0.999 (2.6 degrees).
Identical numerics give cosine 1; a float32 run on another device typically stays above 0.9999;
a bf16 run against an fp32 one around 0.99-0.999. Tune per use in ``plugins.yaml``::

    checkers:
      - grad_direction: {min_cosine: 0.95, warn_cosine: 0.99}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from torchparity import hookimpl
from torchparity.errors import PluginError
from torchparity.plugin_types import CheckContext, Checker

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__version__ = "0.1.0"


class GradDirectionChecker(Checker):
    """Gradient direction drift between two runs (cosine of direction sketches)."""

    name = "grad_direction"
    scopes = frozenset({"grads"})
    description = "gradient direction drift between two runs: cosine / sign agreement per parameter and step"

    @dataclass
    class Options:
        #: below this cosine a parameter's gradient direction has drifted (error)
        min_cosine: float = 0.99
        #: below this cosine: warning
        warn_cosine: float = 0.999
        #: gradients smaller than this share of the step's largest gradient norm are not judged
        min_norm_share: float = 1e-4
        #: optional: also an error when the sketch sign agreement is below this (0 = off)
        min_sign_agreement: float = 0.0

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if not -1.0 <= float(o.min_cosine) <= float(o.warn_cosine) <= 1.0:
            raise PluginError("checker 'grad_direction': need -1 <= min_cosine <= warn_cosine <= 1")
        if float(o.min_norm_share) < 0 or not 0 <= float(o.min_sign_agreement) <= 1:
            raise PluginError("checker 'grad_direction': min_norm_share must be >= 0 and min_sign_agreement in [0, 1]")

    def judge_rows(self, rows: pd.DataFrame, ctx: CheckContext) -> pd.DataFrame:
        """``verdict`` and ``reason`` per row (see the module docstring)."""
        import numpy as np
        import pandas as pd

        o = self.options
        n = len(rows)
        verdict = np.full(n, "pass", dtype=object)
        reason = np.full(n, "", dtype=object)
        cos = rows["cosine"].to_numpy(dtype=np.float64)
        sign = rows["sign_agreement"].to_numpy(dtype=np.float64)
        share = rows["norm_share"].to_numpy(dtype=np.float64)
        na, nb = rows["norm_a"].to_numpy(dtype=np.float64), rows["norm_b"].to_numpy(dtype=np.float64)
        bad_a, bad_b = rows["nonfinite_a"].to_numpy() > 0, rows["nonfinite_b"].to_numpy() > 0

        warn = cos < float(o.warn_cosine)
        for i in np.flatnonzero(warn):
            verdict[i] = "warning"
            reason[i] = f"direction moved: cosine {cos[i]:.6f} < {o.warn_cosine} (sign agreement {sign[i]:.3f})"
        err = cos < float(o.min_cosine)
        if float(o.min_sign_agreement) > 0:
            err |= sign < float(o.min_sign_agreement)
        for i in np.flatnonzero(err):
            verdict[i] = "error"
            reason[i] = (f"direction drifted: cosine {cos[i]:.4f} < {o.min_cosine}, sign agreement {sign[i]:.3f}, "
                         f"norm {na[i]:.3g} vs {nb[i]:.3g}")
        tiny = np.maximum(np.nan_to_num(share, nan=0.0), 0.0) < float(o.min_norm_share)
        for i in np.flatnonzero(tiny):
            verdict[i] = "skip"
            reason[i] = f"gradient too small to have a direction ({share[i]:.1e} of the step's largest gradient norm)"
        one_zero = ((na == 0) != (nb == 0)) & ~tiny
        for i in np.flatnonzero(one_zero):
            verdict[i] = "error"
            reason[i] = f"gradient is zero in one run only (norm {na[i]:.3g} vs {nb[i]:.3g})"
        nonfinite = bad_a != bad_b
        for i in np.flatnonzero(nonfinite):
            verdict[i] = "error"
            reason[i] = ("NaN/Inf in the gradient of run A only" if bad_a[i] else "NaN/Inf in the gradient of run B only")
        return pd.DataFrame({"verdict": verdict, "reason": reason}, index=rows.index)


@hookimpl
def torchparity_checkers() -> Iterator[Checker]:
    yield GradDirectionChecker()
