"""Compare two gradient runs: cosine and sign agreement of the direction sketches, per parameter
and step; the first step and parameter whose gradient direction drifts.

Verdicts come from the checkers registered for the ``grads`` scope (the ``grad_direction``
plugin, ``checkers/grad_direction``): each gets the metric rows and returns ``verdict`` /
``reason`` columns (``pass`` / ``warning`` / ``error``; ``skip`` for gradients too small to have
a direction). The first drift is the earliest step with an ``error`` row; within that step the
parameter whose direction moved most (lowest cosine) is named, the others of that step are listed
by decreasing drift.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..plugin_types import VERDICT_RANK, CheckContext
from .sketch import STATS
from .store import GradRun, load_run

_I = {name: i for i, name in enumerate(STATS)}
#: a parameter whose values differ by more than this (relative L2, estimated from the sketches) and
#: 10x the step's median is named as the origin of a drift
PARAM_DIFF_MIN = 1e-3


@dataclass
class GradCompareResult:
    """What :func:`compare_runs` found."""

    rows: Any  # pandas DataFrame, one row per (rank, step, parameter)
    summary: dict[str, Any]
    first_drift: dict[str, Any] | None = None
    drifted: list[dict[str, Any]] = field(default_factory=list)  # the first drift step's error rows, worst first
    output_dir: Path | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return self.first_drift is not None


def _metrics(a: Any, b: Any, ia: list[int], ib: list[int]) -> dict[str, Any]:
    """Vectorised metrics for the paired parameters of one (rank, step)."""
    import numpy as np

    sa, sb = a.sketch[ia].astype(np.float64), b.sketch[ib].astype(np.float64)
    ta, tb = a.stats[ia], b.stats[ib]
    na, nb = np.linalg.norm(sa, axis=1), np.linalg.norm(sb, axis=1)
    dot = (sa * sb).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where((na > 0) & (nb > 0), dot / (na * nb), np.where((na == 0) & (nb == 0), 1.0, 0.0))
        sign = (np.sign(sa) == np.sign(sb)).mean(axis=1) if sa.shape[1] else np.ones(len(ia))
        ga, gb = ta[:, _I["norm"]], tb[:, _I["norm"]]
        rel = np.where(gb > 0, np.abs(ga - gb) / gb, np.where(ga == 0, 0.0, np.inf))
    prel = np.full(len(ia), np.nan)
    if a.param_sketch is not None and b.param_sketch is not None:
        pa, pb = a.param_sketch[ia].astype(np.float64), b.param_sketch[ib].astype(np.float64)
        dist, ref = np.linalg.norm(pa - pb, axis=1), np.linalg.norm(pb, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            prel = np.where(ref > 0, dist / ref, np.where(dist == 0, 0.0, np.inf))
    cos = np.where((sa == sb).all(axis=1), 1.0, cos)  # identical gradients: exactly 1, not 1 - 1 ulp
    return {"cosine": np.clip(cos, -1.0, 1.0), "param_rel_diff": prel, "sign_agreement": sign, "norm_a": ga, "norm_b": gb, "norm_rel_diff": rel,
            "numel": ta[:, _I["numel"]].astype(np.int64),
            "nonfinite_a": (ta[:, _I["nan"]] + ta[:, _I["inf"]]).astype(np.int64),
            "nonfinite_b": (tb[:, _I["nan"]] + tb[:, _I["inf"]]).astype(np.int64),
            "pos_frac_a": ta[:, _I["pos_frac"]], "pos_frac_b": tb[:, _I["pos_frac"]]}


def _check_compatible(a: GradRun, b: GradRun) -> None:
    for key in ("sketch", "sketch_dim", "seed"):
        if a.header.get(key) != b.header.get(key):
            raise UsageError(f"the two gradient runs were recorded with different {key} ({a.header.get(key)!r} in {a.path} "
                             f"vs {b.header.get(key)!r} in {b.path}); record both with the same GradMonitor settings")


def compare_runs(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], output_dir: str | os.PathLike[str] | None = None,
                 *, rank: int | None = None, plugins: Any = None) -> GradCompareResult:
    """Compare two :class:`~torchparity.gradients.GradMonitor` runs (``run_a`` = the device under
    test, ``run_b`` = the benchmark). Writes ``OUT/grad_compare.json`` when ``output_dir`` is given.

    Raises :class:`UsageError` for directories that are not gradient runs, runs with different
    sketch settings, or runs with no (rank, step) in common.
    """
    import numpy as np
    import pandas as pd

    a, b = load_run(run_a), load_run(run_b)
    _check_compatible(a, b)
    ranks = sorted(set(a.ranks) & set(b.ranks))
    if rank is not None:
        ranks = [r for r in ranks if r == rank]
    pairs = [(r, s) for r in ranks for s in sorted(set(a.steps(r)) & set(b.steps(r)))]
    if not pairs:
        raise UsageError(f"the gradient runs share no (rank, step): {a.path} has {_units(a)}, {b.path} has {_units(b)}"
                         + (f" (rank {rank} requested)" if rank is not None else ""))
    warnings: list[str] = []
    for r in ranks:
        only_a, only_b = set(a.steps(r)) - set(b.steps(r)), set(b.steps(r)) - set(a.steps(r))
        if only_a or only_b:
            warnings.append(f"rank {r}: steps only in {a.path}: {sorted(only_a)[:5]}, only in {b.path}: {sorted(only_b)[:5]}")
    frames = []
    for r, s in pairs:
        da, db = a.read(r, s), b.read(r, s)
        pos_b = {n: i for i, n in enumerate(db.params)}
        common = [n for n in da.params if n in pos_b]
        missing = sorted(set(da.params) ^ set(db.params))
        if missing:
            warnings.append(f"rank {r} step {s}: {len(missing)} parameter(s) recorded on one side only (first: {missing[0]})")
        if not common:
            continue
        ia = [da.params.index(n) for n in common]
        ib = [pos_b[n] for n in common]
        m = _metrics(da, db, ia, ib)
        f = pd.DataFrame({"rank": r, "step": s, "param": common, "order": ia, **m})
        # relative size of each gradient within its step: "too small to have a direction"
        step_max = float(np.nanmax(np.maximum(f["norm_a"].to_numpy(), f["norm_b"].to_numpy()))) if len(f) else 0.0
        f["norm_share"] = np.maximum(f["norm_a"], f["norm_b"]) / step_max if step_max > 0 else 0.0
        frames.append(f)
    if not frames:
        raise UsageError(f"the gradient runs have no parameter in common ({a.path} vs {b.path})")
    rows = pd.concat(frames, ignore_index=True)
    rows = _judge(rows, plugins)
    first, drifted = _first_drift(rows)
    v = rows["verdict"].value_counts().to_dict()
    summary = {
        "run_a": str(a.path), "run_b": str(b.path), "ranks": ranks, "steps": sorted({s for _, s in pairs}),
        "n_rows": int(len(rows)), "n_pass": int(v.get("pass", 0)), "n_warning": int(v.get("warning", 0)),
        "n_error": int(v.get("error", 0)), "n_skip": int(v.get("skip", 0)),
        "sketch_dim": a.header.get("sketch_dim"), "first_drift": first, "warnings": warnings,
        "checkers": sorted(set(rows["checker"].dropna()) - {""}),
    }
    res = GradCompareResult(rows=rows, summary=summary, first_drift=first, drifted=drifted)
    if output_dir is not None:
        res.output_dir = Path(output_dir)
        res.files.append(_write_json(res, res.output_dir))
    return res


def _units(run: GradRun) -> str:
    return ", ".join(f"rank{r}/steps {run.steps(r)[0]}..{run.steps(r)[-1]}" for r in run.ranks) or "no steps"


def _judge(rows: Any, plugins: Any) -> Any:
    from ..plugins import get_registry

    reg = plugins if plugins is not None and hasattr(plugins, "checkers_for") else get_registry(plugins)
    checkers = reg.checkers_for("grads")
    if not checkers:
        raise UsageError("no checker for gradient runs is enabled: install torchparity-checker-grad-direction "
                         "(pip install -e ./checkers/grad_direction) or enable 'grad_direction' in plugins.yaml")
    rows = rows.copy()
    rows["verdict"], rows["reason"], rows["checker"] = "skip", "", ""
    for c in checkers:
        out = c.judge_rows(rows, CheckContext(mode="grads"))
        worse = out["verdict"].map(VERDICT_RANK).fillna(0) > rows["verdict"].map(VERDICT_RANK).fillna(0)
        rows.loc[worse, "verdict"] = out.loc[worse, "verdict"]
        rows.loc[worse, "reason"] = out.loc[worse, "reason"]
        rows.loc[worse, "checker"] = c.name
    return rows


def _first_drift(rows: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The earliest step with a drifted gradient, and whom to name in it.

    If some parameters' *values* already differ at that step far more than the others' (relative
    sketch distance above ``PARAM_DIFF_MIN`` and 10x the step's median), the worst of them is
    named (``kind: parameter``): every gradient computed from it drifts as a consequence, which
    is why the drifted gradients alone cannot point at it. Otherwise the parameter whose gradient
    direction moved most (lowest cosine) is named (``kind: gradient``).
    """
    import numpy as np

    err = rows[rows["verdict"] == "error"]
    if not len(err):
        return None, []
    step = int(err["step"].min())
    at = err[err["step"] == step].sort_values(["cosine", "rank", "order"], kind="stable")
    drifted = [_row_dict(r) for r in at.to_dict("records")]
    here = rows[rows["step"] == step]
    prel = here["param_rel_diff"].to_numpy(dtype=np.float64)
    first: dict[str, Any] | None = None
    if np.isfinite(prel).any() or np.isinf(prel).any():
        med = float(np.nanmedian(np.where(np.isfinite(prel), prel, np.nan))) if np.isfinite(prel).any() else 0.0
        outliers = here[(prel > PARAM_DIFF_MIN) & (prel > 10 * med)]
        if len(outliers):
            r = outliers.sort_values(["param_rel_diff", "order"], ascending=[False, True], kind="stable").iloc[0].to_dict()
            first = _row_dict(r)
            first["kind"] = "parameter"
            first["reason"] = (f"the parameter's values already differ at step {step} (relative difference "
                               f"{r['param_rel_diff']:.3g}, step median {med:.3g}); the gradients computed from it drift "
                               f"as a consequence" + (f"; its own gradient: {r['reason']}" if r.get("reason") else ""))
    if first is None:
        first = dict(drifted[0])
        first["kind"] = "gradient"
    first["n_params_drifted"] = len(drifted)
    first["n_params"] = int(((rows["step"] == step) & (rows["rank"] == first["rank"])).sum())
    return first, drifted


def _row_dict(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "rank", "param", "cosine", "sign_agreement", "norm_a", "norm_b", "norm_rel_diff", "param_rel_diff",
            "numel", "reason")
    out = {}
    for k in keys:
        v = r.get(k)
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v
    return out


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _write_json(res: GradCompareResult, out: Path) -> Path:
    import json

    out.mkdir(parents=True, exist_ok=True)
    path = out / "grad_compare.json"
    cols = ["rank", "step", "param", "order", "numel", "cosine", "sign_agreement", "norm_a", "norm_b", "norm_rel_diff",
            "norm_share", "param_rel_diff", "nonfinite_a", "nonfinite_b", "verdict", "reason", "checker"]
    doc = {"format": "torchparity-grad-compare", "schema_version": 1, "diverged": res.diverged,
           "summary": _jsonable(res.summary), "first_drift": _jsonable(res.first_drift),
           "drifted": _jsonable(res.drifted), "columns": cols,
           "rows": [_jsonable(r) for r in res.rows[cols].to_dict("records")]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)
    return path
