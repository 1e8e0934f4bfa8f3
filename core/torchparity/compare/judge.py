"""Verdicts: run the checker plugins over the compare rows; the worst verdict wins.

Each checker returns ``verdict``/``reason`` per row (``skip`` where it has nothing to say). Rows
no checker judged (none installed, or none with something to say) go to the built-in rules: what
is never acceptable (NaN/Inf that do not coincide, a differing checksum of same-dtype tensors, a
differing scalar argument) is an error, a tensor within its dtype's rounding passes, and the rest
is marked ``unchecked:`` - so a broken install cannot turn into "all pass".
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from ..errors import PluginError
from ..plugin_types import VERDICT_RANK, CheckContext, Checker

log = logging.getLogger("torchparity")


#: reason prefix of rows that no checker judged (they are ``skip``, counted as unchecked)
UNCHECKED = "unchecked: "


def builtin_verdicts(rows: Any) -> Any:
    """The fallback judge (no checker plugin installed, or none that worked).

    ``error``: NaN/Inf that do not coincide, a differing checksum of same-dtype tensors, a
    differing scalar argument. ``pass``: a paired tensor whose error is within its dtype's
    rounding (the ``floor`` the root-cause analysis uses). Anything above that floor is left
    ``skip`` - unchecked, not passed: judging it needs tolerances (the allclose checker)."""
    n = len(rows)
    matched = rows["match"].to_numpy() != "unmatched"
    verdict = np.full(n, "skip", dtype=object)
    reason = np.full(n, "", dtype=object)
    kind = rows["kind"].to_numpy(dtype=object) if "kind" in rows.columns else np.full(n, "tensor", dtype=object)
    err = rows["error"].to_numpy(dtype="float64") if "error" in rows.columns else np.full(n, np.nan)
    floor = rows["floor"].to_numpy(dtype="float64") if "floor" in rows.columns else np.full(n, np.nan)
    with np.errstate(invalid="ignore"):
        within = matched & (kind == "tensor") & (err <= floor)
    verdict[within] = "pass"
    reason[within] = "within the rounding of its dtype (built-in rule)"
    if "value_differs" in rows.columns:
        sc = matched & (kind == "scalar")
        vd = sc & rows["value_differs"].fillna(False).to_numpy(dtype=bool)
        verdict[sc & ~vd] = "pass"
        verdict[vd] = "error"
        reason[vd] = "argument value differs from the benchmark"
    nf = rows["nonfinite_mismatch"].fillna(False).to_numpy(dtype=bool) & matched
    verdict[nf] = "error"
    reason[nf] = "NaN/Inf positions differ from the benchmark"
    md5_bad = (rows["md5_equal"] == False).to_numpy() & (rows["device_dtype"] == rows["bench_dtype"]).to_numpy()  # noqa: E712
    verdict[md5_bad & ~nf] = "error"
    reason[md5_bad & ~nf] = "checksum differs"
    return _verdicts(verdict, reason, rows.index)


def _fallback(rows: Any, verdict: np.ndarray, reason: np.ndarray, who: np.ndarray, names: list[str]) -> None:
    """Paired rows every checker skipped without a reason (in place): the built-in rules judge
    them (within rounding: ``pass``); the tensors they cannot judge are marked ``unchecked: ...``
    instead of being left a bare ``skip``."""
    if not len(verdict) or "error" not in rows.columns:
        return
    bare = (verdict == "skip") & np.array([not r for r in reason], dtype=bool)
    if "match" in rows.columns:
        bare &= rows["match"].to_numpy() != "unmatched"
    if not bare.any():
        return
    if names != ["builtin"]:
        b = builtin_verdicts(rows)
        bv, br = b["verdict"].to_numpy(dtype=object), b["reason"].to_numpy(dtype=object)
        take = bare & (bv != "skip")
        verdict[take], reason[take], who[take] = bv[take], br[take], "builtin"
        bare &= ~take
    kind = rows["kind"].to_numpy(dtype=object) if "kind" in rows.columns else np.full(len(verdict), "tensor", dtype=object)
    err = rows["error"].to_numpy(dtype="float64")
    bare &= (kind == "tensor") & ~np.isnan(err)
    if bare.any():
        reason[bare] = [f"{UNCHECKED}error {e:.3g}, above the rounding of its dtype; no checker judged it "
                        f"(checkers: {', '.join(names)})" for e in err[bare].tolist()]


def _verdicts(verdict: Any, reason: Any, index: Any) -> Any:
    """The checker's answer: ``verdict``/``reason`` object columns (pandas >= 3 would infer its
    slower ``str`` dtype from object arrays of strings)."""
    import pandas as pd

    return pd.DataFrame({"verdict": pd.Series(verdict, index=index, dtype=object),
                         "reason": pd.Series(reason, index=index, dtype=object)})


def judge(rows: Any, checkers: Sequence[Checker], mode: str) -> tuple[Any, list[str]]:
    """Add ``verdict``, ``reason`` and ``checker`` columns to ``rows`` (in place); return rows and
    the problems met (a checker that failed is reported and skipped)."""
    import pandas as pd

    problems: list[str] = []
    n = len(rows)
    best = np.zeros(n, dtype=int)  # VERDICT_RANK of "skip"
    verdict = np.full(n, "skip", dtype=object)
    reason = np.full(n, "", dtype=object)
    who = np.full(n, "", dtype=object)
    results: list[tuple[str, Any]] = []
    for c in checkers:
        try:
            res = c.judge_rows(rows, CheckContext(mode=mode))
        except PluginError as exc:
            problems.append(str(exc))
            continue
        except Exception as exc:  # a broken plugin must not break the comparison
            problems.append(f"checker '{c.name}' failed ({type(exc).__name__}: {exc}); its verdicts are missing. "
                            f"Disable it in plugins.yaml or report it to its author")
            continue
        results.append((c.name, res))
    if not results:
        if not checkers:
            problems.append("no checker plugin is installed or enabled: using the built-in rules only (NaN/Inf, "
                            "checksums, within-rounding passes); pip install -e ./checkers/allclose ./checkers/md5")
        results.append(("builtin", builtin_verdicts(rows)))
    for name, res in results:
        v, rsn = res["verdict"], res["reason"]
        if not res.index.equals(rows.index):
            v, rsn = v.reindex(rows.index), rsn.reindex(rows.index)
        v = v.to_numpy(dtype=object)
        rank = _ranks(v)  # a missing or unknown verdict ranks as "skip": never taken below
        worse = rank > best
        if not worse.any():
            continue
        # masked updates (only the rows this checker makes worse): same result as np.where
        # over every row, without touching 200k object references per column and checker
        r = rsn.to_numpy(dtype=object)[worse]
        r[pd.isna(r)] = ""
        best[worse] = rank[worse]
        verdict[worse] = v[worse]
        reason[worse] = r
        who[worse] = name
        # same verdict from several checkers: keep the first reason, note the other checker
    _fallback(rows, verdict, reason, who, [name for name, _ in results])
    if "match" in rows.columns:  # nothing to pass against: an unmatched row is skipped unless a checker flags it
        um = (rows["match"].to_numpy() == "unmatched") & (verdict == "pass")
        if um.any():
            if "device_record_id" in rows.columns:
                dev_side = rows["device_record_id"].to_numpy()[um] >= 0
                msg = np.where(dev_side, "only in the device dump: no benchmark record",
                               "only in the benchmark dump: no device record").astype(object)
            else:
                msg = "unmatched: no counterpart in the other dump"
            verdict[um] = "skip"
            reason[um] = msg
            who[um] = ""
    rows["verdict"] = pd.Series(verdict, index=rows.index, dtype=object)
    rows["reason"] = pd.Series(reason, index=rows.index, dtype=object)
    rows["checker"] = pd.Series(who, index=rows.index, dtype=object)
    return rows, problems


def _ranks(v: np.ndarray) -> np.ndarray:
    """VERDICT_RANK per row (0 for anything unknown): one comparison per verdict name."""
    rank = np.zeros(len(v), dtype=int)
    for name, r in VERDICT_RANK.items():
        if r:
            rank[v == name] = r
    return rank
