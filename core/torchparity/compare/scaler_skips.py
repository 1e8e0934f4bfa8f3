"""Steps a GradScaler skipped: its scaled backward overflowed, by design.

An fp16 run's GradScaler starts with a scale high enough that the first backward passes
overflow (Inf/NaN gradients); it finds them (``_amp_foreach_non_finite_check_and_unscale_``),
skips ``optimizer.step()`` and lowers the scale. Such a backward is not a numerics divergence
from the benchmark but the scaler's search for its scale: its records are not judged (no root
cause is named in them), and the compare says why. Steps end on ``optimizer.step()``, so the
iterations the scaler skipped are in the step of the next one that stepped (found by a new-user
check, session 18: an fp16-AMP Llama started at scale 2**24 was compared with its fp32 run and
the scaler's overflow, ``_to_copy`` in the backward, was named the root cause).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..naninf_rule import gradscaler_found_inf
from .integrity import NOT_COMPARED
from .loss_scale import UNSCALE_OP, UPDATE_OP, _base, _computes_fp16, _module_only, pd_num


def found_inf(both: Any, p: str) -> bool:
    """Did side ``p`` (``"d_"``/``"b_"``) of this (step, rank) have a GradScaler find Inf/NaN
    gradients (:func:`~torchparity.naninf_rule.gradscaler_found_inf`, the rule ``torchparity
    overflow`` applies too)?"""
    col = f"{p}op"
    if col not in both or not len(both):
        return False
    op = both[col].to_numpy(dtype=object)
    bases = {o: _base(o) for o in set(op.tolist())}
    if UNSCALE_OP not in bases.values() and UPDATE_OP not in bases.values():
        return False
    base = np.array([bases[o] for o in op], dtype=object)
    mx = pd_num(both[f"{p}max"].to_numpy(dtype=object)) if f"{p}max" in both else np.full(len(both), np.nan)
    return bool(gradscaler_found_inf(base, both[f"{p}io"].to_numpy(dtype=object),
                                     both[f"{p}arg"].astype(str).to_numpy(dtype=object), mx, _bad(both, p)).any())


def _bad(both: Any, p: str) -> np.ndarray:
    def num(c: str) -> np.ndarray:
        return pd_num(both[f"{p}{c}"].to_numpy(dtype=object)) if f"{p}{c}" in both else np.full(len(both), np.nan)

    with np.errstate(invalid="ignore"):
        return (num("nan") > 0) | (num("inf") > 0) | np.isinf(num("max")) | np.isinf(num("min"))


def module_level_overflow(both: Any) -> bool:
    """A module-level dump (no scaler op recorded) of a float16 device run whose backward holds
    Inf/NaN the benchmark's does not, while its forward is finite: the overflow of a GradScaler
    searching its scale (or of an unscaled float16 backward: the warning says both)."""
    if not len(both) or not _module_only(both) or not _computes_fp16(both):
        return False
    phase = both["d_phase"].to_numpy(dtype=object)
    has = both["d_name"].notna().to_numpy()
    d_bad, b_bad = _bad(both, "d_"), _bad(both, "b_")
    fwd = has & (phase == "forward")
    back = has & (phase == "backward")
    return bool((back & d_bad & ~b_bad).any()) and not bool((fwd & d_bad).any())


def skipping_sides(both: Any) -> tuple[list[str], bool]:
    """The sides (``"device"``, ``"bench"``) whose GradScaler skipped an optimizer step in this
    (step, rank), found by the scaler's ops; and whether, with no scaler op recorded (a
    module-level dump), the device's float16 backward overflowed as a scaler's does."""
    sides = [side for side, p in (("device", "d_"), ("bench", "b_")) if found_inf(both, p)]
    return sides, not sides and module_level_overflow(both)


def skip_line(step: int, rank: int, sides: list[str], inferred: bool = False) -> str:
    if inferred:
        return (f"step{step}/rank{rank}: the device run's float16 backward holds Inf/NaN the benchmark's does not, "
                f"while its forward is finite: a GradScaler whose loss scale is too high for this backward does "
                f"this by design and skips the step (as in the first steps of most float16 runs; a module-level "
                f"dump does not record the scaler: dump at aten level to see it), an unscaled float16 backward "
                f"overflows the same way; the backward of this step is not compared, no root cause is named in it")
    who = " and the ".join(sides)
    return (f"step{step}/rank{rank}: the {who} run's GradScaler found Inf/NaN in its scaled gradients and "
            f"skipped the optimizer step (a loss scale too high for this backward, as in the first steps of "
            f"most float16 runs: by design); the backward of this step is not compared, no root cause is named "
            f"in it. Steps end on optimizer.step(): the skipped iterations are in this step. Compare a step "
            f"in which the scaler did not skip (dump more steps, or start it lower: GradScaler(init_scale=...))")


#: marks the rows of a skipped step's backward (:func:`mark`, :func:`apply`); dropped before reports
COLUMN = "scaler_skipped"
REASON = NOT_COMPARED + "the GradScaler skipped this step: its scaled backward overflowed, by design"
ONE_SIDED = "one side only; the GradScaler skipped this step: its scaled backward overflowed, by design"


def mark(rows: Any) -> set[int]:
    """Mark the compared rows of a skipped step's backward and of the scaler's own check (in
    place); returns the device record ids of the backward (not judged by the root-cause search)."""
    back = rows["phase"].to_numpy(dtype=object) == "backward"
    op = rows["op"].to_numpy(dtype=object) if "op" in rows.columns else np.full(len(rows), "", dtype=object)
    bases = {o: _base(o) for o in set(op.tolist())}
    scaler = np.isin(np.array([bases[o] for o in op], dtype=object), [UNSCALE_OP, UPDATE_OP])
    # 1: a compared row (not compared after all), 2: a row of one side only (no error either)
    rows[COLUMN] = np.where(back | scaler, np.where(rows["match"].to_numpy() != "unmatched", 1, 2), 0)
    ids = pd_num(rows["d_record_id"].to_numpy(dtype=object))[back]
    return {int(i) for i in ids if i == i and i >= 0}


def apply(rows: Any) -> int:
    """The marked rows become ``skip`` (whatever a checker said: their Inf/NaN is the scaler's),
    the compared ones "not compared", and the marker column goes; returns how many compared rows."""
    import pandas as pd

    if COLUMN not in rows.columns:
        return 0
    kind = rows[COLUMN].fillna(0).to_numpy(dtype=int)
    del rows[COLUMN]
    sel = kind > 0
    if not sel.any():
        return 0
    for col, val in (("verdict", "skip"), ("reason", None), ("checker", "")):
        v = rows[col].to_numpy(dtype=object).copy()
        if val is None:
            v[kind == 1], v[kind == 2] = REASON, ONE_SIDED
        else:
            v[sel] = val
        rows[col] = pd.Series(v, index=rows.index, dtype=object)
    return int((kind == 1).sum())
