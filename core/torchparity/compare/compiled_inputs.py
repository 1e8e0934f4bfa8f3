"""Input errors of records a compiled compare cannot read directly.

A compiled graph stores some values only: an eager op's inputs may have been fused away (GPT-2's
GELU chain), and a compiled record has no inputs at all. ``rootcause`` gives such records an input
error from what it can see, so that an op is judged neither against a guess of zero (which blamed
the first op past the floor) nor not at all (which missed the fault) - docs/compile.md."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dataflow import record_edges


def through_unmatched(r: Any, is_in: Any, rec_ids: np.ndarray, o_err: np.ndarray, recs: Any,
                       floor: np.ndarray) -> np.ndarray:
    """Per record: the largest error its inputs carry, traced back through the data flow past
    records whose outputs were not compared (ops a compiled graph fused away) to the compared
    values that fed them, each such record adding its own rounding (``floor``: an fp16 matmul
    under autocast between two float32 values); NaN where nothing compared feeds it."""
    import pandas as pd

    n = len(rec_ids)
    cons, prod = record_edges(r, is_in, rec_ids)
    order = pd.to_numeric(recs["order"], errors="coerce").to_numpy(dtype="float64")
    walk = np.argsort(order, kind="stable")
    starts, ends = np.searchsorted(cons, walk, side="left"), np.searchsorted(cons, walk, side="right")
    carried = np.array(o_err, dtype="float64")  # what each record's outputs carry: measured, else traced
    traced = np.full(n, np.nan)
    for k, a, b in zip(walk.tolist(), starts.tolist(), ends.tolist()):
        if b > a:
            got = carried[prod[a:b]]
            if not np.isnan(got).all():
                traced[k] = float(np.nanmax(got))
        if np.isnan(carried[k]) and not np.isnan(traced[k]):
            carried[k] = max(traced[k], float(np.nan_to_num(floor[k], nan=0.0)))
    return traced


def error_before(o_err: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per record: the largest output error of the records before it in execution order (0 for
    the first)."""
    srt = np.argsort(order, kind="stable")
    run = np.fmax.accumulate(np.nan_to_num(o_err[srt], nan=0.0, posinf=np.inf, neginf=0.0))
    before = np.empty(len(o_err))
    before[srt] = np.concatenate([[0.0], run[:-1]]) if len(run) else run
    return before
