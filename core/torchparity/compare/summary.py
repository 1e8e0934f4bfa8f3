"""The summary of a comparison (counts, root cause, what was not compared) and the reporters.

Counts add up: ``n_pass + n_warning + n_error + n_skip == n_rows``. Among the skipped rows,
``n_not_compared`` are paired tensors whose numbers were missing (a damaged dump read with
``allow_partial``) and ``n_unchecked`` are rows no checker judged (none installed, or none with
something to say); ``n_damaged`` counts the damage the readers reported. A comparison is
*complete* when nothing was damaged or left uncompared; the CLI exits 0 ("the runs agree") only
for a complete comparison without divergence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..results import CompareResult, Suspect
from .integrity import NOT_COMPARED
from .judge import UNCHECKED


def normalise_formats(formats: Any) -> list[str] | None:
    """Reporter names from ``"log,xlsx"`` or a list (None: the default)."""
    if formats is None:
        return None
    if isinstance(formats, str):
        formats = [formats]
    out: list[str] = []
    for f in formats:
        out += [x.strip() for x in str(f).split(",") if x.strip()]
    return out


def _starts(rows: Any, prefix: str) -> Any:
    """Skipped rows whose reason starts with ``prefix`` (only the skipped rows are looked at)."""
    import numpy as np

    skipped = (rows["verdict"] == "skip").to_numpy()
    out = np.zeros(len(rows), dtype=bool)
    idx = np.flatnonzero(skipped)
    if len(idx):
        r = rows["reason"].to_numpy(dtype=object)[idx]
        out[idx] = [isinstance(x, str) and x.startswith(prefix) for x in r]
    return out


def summary(rows: Any, dev: Any, ben: Any, mode: str, root: Suspect | None, per_pair: list[dict[str, Any]],
            warnings: list[str], threshold: float, checkers: list[Any], elapsed: float,
            lost: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``CompareResult.summary`` dict (see the module docstring for the counts); ``lost``:
    step directories a dump no longer holds (read with ``allow_partial``), counted as damage."""
    v = rows["verdict"].value_counts().to_dict()
    um = rows["match"] == "unmatched"
    first = None
    if root is not None:
        first = {"step": root.step, "rank": root.rank, "name": root.name, "index": root.index, "op": root.op,
                 "module": root.module, "phase": root.phase}
    diverged_pairs = [p for p in per_pair if p["root_cause"]]
    n_not_compared = int(_starts(rows, NOT_COMPARED).sum())
    n_unchecked = int(_starts(rows, UNCHECKED).sum())
    damaged = [w for p in per_pair for w in p.get("damaged", [])] + list(lost)
    return {
        "device_dump": str(dev.path), "bench_dump": str(ben.path),
        "device_format": dev.format, "bench_format": ben.format, "mode": mode,
        "steps": sorted({p["step"] for p in per_pair}), "ranks": sorted({p["rank"] for p in per_pair}),
        "n_rows": int(len(rows)), "n_compared": int((~um).sum()) - n_not_compared,
        "n_unmatched_device": int((um & (rows["device_record_id"] >= 0)).sum()),
        "n_unmatched_bench": int((um & (rows["device_record_id"] < 0)).sum()),
        "n_pass": int(v.get("pass", 0)), "n_warning": int(v.get("warning", 0)), "n_error": int(v.get("error", 0)),
        "n_skip": int(v.get("skip", 0)),
        "n_not_compared": n_not_compared, "n_unchecked": n_unchecked, "n_damaged": len(damaged),
        "complete": n_not_compared == 0 and not damaged,
        "diverged": root is not None or int(v.get("error", 0)) > 0,
        "first_divergence": first,
        "diverged_pairs": [{"step": p["step"], "rank": p["rank"], "root_cause": p["root_cause"]} for p in diverged_pairs],
        "pairs": per_pair,
        "threshold": threshold,
        "checkers": [c.name for c in checkers] or ["builtin"],
        "elapsed_s": round(elapsed, 3),
        "warnings": warnings,
    }


def incomplete_warnings(rows: Any, s: dict[str, Any]) -> list[str]:
    """One warning per kind of gap (rows not compared, rows no checker judged)."""
    out: list[str] = []
    if s["n_not_compared"]:
        nc = rows[_starts(rows, NOT_COMPARED)]
        r = nc.iloc[0]
        out.append(f"{s['n_not_compared']} paired tensor(s) could not be compared (first: step{r['step']}/rank{r['rank']} "
                   f"{r['device_name']} {r['tensor']}: {str(r['reason'])[len(NOT_COMPARED):]}); they are not counted "
                   f"as agreeing")
    if s["n_unchecked"]:
        out.append(f"{s['n_unchecked']} row(s) differ beyond the rounding of their dtype and no checker judged them "
                   f"(checkers: {', '.join(s['checkers'])}); install or enable the allclose checker "
                   f"(pip install -e ./checkers/allclose) for pass/warning/error verdicts")
    return out


def report(result: CompareResult, reg: Any, formats: Any, warnings: list[str]) -> None:
    """Run the requested reporters (or every enabled one when an output directory is given)."""
    wanted = normalise_formats(formats)
    if reg is None:
        return
    reporters = reg.reporters
    if wanted is None:
        if result.output_dir is None:
            return
        names = list(reporters)
    else:
        names = wanted
        missing = [n for n in names if n not in reporters]
        for n in missing:
            warnings.append(f"no reporter named '{n}' is installed (installed: {', '.join(reporters) or 'none'}); "
                            f"skipped that format")
        names = [n for n in names if n in reporters]
    if not names:
        return
    from ..plugin_types import write_reports  # one output-dir check; a failing reporter costs only its report

    result.output_dir = Path(result.output_dir or "torchparity_compare")
    written, problems = write_reports(result, reporters, names, result.output_dir)
    result.reports.update(written)
    warnings += problems
