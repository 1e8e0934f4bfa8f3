"""Results of a comparison, as handed to reporters and returned by :func:`torchparity.compare`.

``CompareResult.rows`` is a pandas DataFrame with one row per compared tensor (or scalar
argument). Its columns are a stable contract (documented in ``docs/compare.md``); reporters pick
the ones they show. The core columns:

identity
    ``device_name``, ``bench_name`` (record names, e.g. ``Aten.mm.3.forward``), ``tensor``
    (``input.0``, ``output.0``, ``param.weight``...), ``op``, ``module``, ``phase``, ``step``,
    ``rank``, ``order`` (execution order of the device record), ``io`` (input/output/param/grad),
    ``match`` (how the pair was found: exact, no_counter, shape, align, unmatched).
description
    ``device_dtype``, ``bench_dtype``, ``device_shape``, ``bench_shape``.
tensor metrics (tensor mode; NaN where not computed)
    ``cosine``, ``max_abs_err``, ``max_rel_err``, ``mean_rel_err``, ``rmse``, ``euc_dist``,
    ``one_thousandth_ratio``, ``five_thousandth_ratio``, ``worst_index``, ``rel_l2``
    (``||d-b|| / ||b||``, the error measure used for root cause).
statistics (all modes)
    ``device_max/min/mean/norm``, ``bench_max/min/mean/norm``, ``max_diff``..``norm_diff``,
    ``max_rel_diff``..``norm_rel_diff``, ``device_nan``, ``device_inf``, ``bench_nan``,
    ``bench_inf``, ``nonfinite_mismatch``.
checksums (md5 mode)
    ``device_md5``, ``bench_md5``, ``md5_equal``.
judgement
    ``verdict`` (skip/pass/warning/error), ``reason``, ``checker`` (who gave the worst verdict:
    a checker plugin, ``builtin`` for the built-in rules, ``rootcause`` for the rows behind a
    suspect), ``error`` (the scalar error estimate used for root cause), ``stack``. A ``skip``
    whose reason starts ``not compared:`` is a paired tensor whose numbers were missing; one
    starting ``unchecked:`` is a row no checker judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


@dataclass
class Suspect:
    """An op that introduced a divergence (its output error is large relative to its inputs')."""

    name: str  # device record name, e.g. "Aten.mul.7.forward"
    op: str  # op identifier, e.g. "aten.mul.Tensor", "torch.nn.functional.gelu", "MLP"
    module: str  # module path, e.g. "layers.1.mlp"
    phase: str  # forward | backward | optimizer | recompute
    step: int
    rank: int
    index: int  # execution order of the record in the device dump (0-based)
    score: float  # amplification: output error / max(input error, floor)
    input_error: float
    output_error: float
    reason: str  # one sentence with the numbers
    bench_name: str | None = None
    level: str = ""
    kind: str = "op"  # op | parameter | input (a divergence at a parameter or model input)
    stack: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    """Everything a comparison found."""

    rows: pd.DataFrame
    summary: dict[str, Any]
    root_cause: Suspect | None = None
    suspects: list[Suspect] = field(default_factory=list)
    output_dir: Path | None = None
    reports: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        """True when a divergence was found (the CLI then exits with code 1)."""
        return self.root_cause is not None or int(self.summary.get("n_error", 0)) > 0

    @property
    def complete(self) -> bool:
        """False when part of the dumps was damaged (read with ``allow_partial``) or a paired
        tensor could not be compared: no divergence then does not mean the runs agree (the CLI
        exits with code 2)."""
        return bool(self.summary.get("complete", True))


def complete_first_divergence(summary: Mapping[str, Any], rows: Any = None, root: Any = None) -> dict[str, Any]:
    """``summary["first_divergence"]`` with op, module and phase filled in.

    The compare engine writes them; results from older versions (or written by hand) may carry
    only name, step, rank and index, so reporters complete them from the root cause or the rows.
    """
    import math

    fd = summary.get("first_divergence")
    if not fd:
        return {}
    if not isinstance(fd, Mapping):
        return {"name": str(fd)}
    out = dict(fd)
    keys = ("op", "module", "phase")
    if root is not None and out.get("name") == getattr(root, "name", None):
        for k in keys:
            if not out.get(k):
                out[k] = getattr(root, k, None)
    missing = [k for k in keys if not out.get(k)]
    if missing and rows is not None and len(rows) and "device_name" in rows.columns and out.get("name"):
        m = rows["device_name"].astype(object).eq(out["name"]).to_numpy(dtype=bool)
        for k in ("step", "rank"):
            if k in rows.columns and out.get(k) is not None:
                m = m & rows[k].eq(out[k]).to_numpy(dtype=bool)
        hit = rows[m]
        if len(hit):
            r = hit.iloc[0].to_dict()
            for k in missing:
                v = r.get(k)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    out[k] = v
    return out

