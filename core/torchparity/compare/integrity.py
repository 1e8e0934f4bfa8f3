"""What could not be compared: never counted as agreeing.

* :func:`clean_identity`: a record field that should be a name (``op``, ``module``...) but holds
  a list, a number or an object (a damaged dump) is turned into text so that matching cannot
  crash on it, and reported as damage (the caller refuses the dump unless ``allow_partial``).
* :func:`not_compared`: paired tensor rows whose numbers are missing (no error estimate, or a
  statistic missing on one side that NaN/Inf counts do not explain, or a tensor on one side and
  None or a plain value on the other). Their ``pass``/``skip``
  verdict becomes ``skip`` with a reason starting ``not compared:``; the summary counts them and
  the CLI never exits 0 ("the runs agree") while any exist.
* :func:`accepted_by_checkers`: a suspect whose output a checker plugin passes (a per-op tolerance
  the user configured) is dropped from the suspects.
* :func:`agree_with_suspects`: the outputs of an op the root-cause analysis names are verdict
  ``error`` whatever the installed checkers said (or did not say), so that a summary never
  reads "N pass, 0 error" beside a root cause.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .metrics import STATS, numel

#: record fields that must be text (or missing) for matching and the reports
IDENTITY_COLUMNS = ("name", "op", "module", "phase", "level", "io", "arg", "kind", "dtype")
#: reason prefix of rows that could not be compared
NOT_COMPARED = "not compared: "


def clean_identity(frame: Any, rel: str, problems: list[str]) -> None:
    """Turn non-text values of :data:`IDENTITY_COLUMNS` into text, in place; append one damage
    message per column that had any (``rel`` names the step/rank)."""
    import pandas as pd

    from ..dump.reader import Damage
    from .matching import text_column

    if not len(frame):
        return
    for c in IDENTITY_COLUMNS:
        if c not in frame.columns:
            continue
        vals = frame[c].to_numpy(dtype=object)
        if pd.api.types.infer_dtype(vals, skipna=True) in ("string", "empty"):  # in C: the usual case
            continue
        try:  # one type check per distinct value (missing values get code -1: the last, False)
            codes, uniq = pd.factorize(vals)
            bad = np.array([not isinstance(u, str) for u in uniq] + [False], dtype=bool)[codes]
        except TypeError:  # unhashable values (lists, dicts): one by one
            bad = np.fromiter((v is not None and not isinstance(v, str) and not (isinstance(v, float) and v != v)
                               for v in vals), dtype=bool, count=len(vals))
        if not bad.any():
            continue
        i = int(np.flatnonzero(bad)[0])
        rid = frame["record_id"].iat[i] if "record_id" in frame.columns else "?"
        shown = repr(vals[i])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        problems.append(Damage(f"{rel}: {int(bad.sum())} tensor entr{'y has' if bad.sum() == 1 else 'ies have'} "
                               f"a '{c}' that is not text (first: record {rid}: {shown}); that record cannot be "
                               f"trusted - re-dump, or compare the rest with --allow-partial"))
        frame[c] = text_column(frame[c])


def not_compared(rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether it is a paired tensor whose numbers are missing, and why (text)."""
    n = len(rows)
    reason = np.full(n, "", dtype=object)
    if not n:
        return np.zeros(0, dtype=bool), reason
    paired = (rows["match"].to_numpy() != "unmatched") & (rows["kind"].to_numpy(dtype=object) == "tensor")
    err = rows["error"].to_numpy(dtype="float64")
    n_d = numel(rows["device_shape"].tolist())
    n_b = numel(rows["bench_shape"].tolist())
    empty = (n_d == 0) & (n_b == 0)  # empty tensors carry no statistics: equal shapes are all there is
    unmeasured = _measured_on_neither_side(rows)  # by design: uninitialised memory, overwritten destinations
    no_error = paired & np.isnan(err) & ~empty & ~unmeasured
    reason[no_error] = NOT_COMPARED + "no statistics to compare on at least one side"
    # a tensor on one side, none (an argument that was None) or a plain value on the other: the
    # combined ``kind`` is the device's, so such a row is no tensor row above, and yet it differs
    d_t = _is_shape(rows["device_shape"].tolist())
    b_t = _is_shape(rows["bench_shape"].tolist())
    one_sided = (rows["match"].to_numpy() != "unmatched") & (d_t != b_t) & ~no_error
    for side, has in (("device", d_t), ("bench", b_t)):
        other = "bench" if side == "device" else "device"
        reason[one_sided & has] = NOT_COMPARED + f"the {side} argument is a tensor, the {other} one is not (None or a value)"
    no_error |= one_sided
    full = rows["rel_l2"].to_numpy(dtype="float64") if "rel_l2" in rows.columns else np.full(n, np.nan)
    partial = np.zeros(n, dtype=bool)
    for side, other in (("device", "bench"), ("bench", "device")):
        nan_c = rows[f"{side}_nan"].to_numpy(dtype="float64")
        inf_c = rows[f"{side}_inf"].to_numpy(dtype="float64")
        explained = (np.nan_to_num(nan_c, nan=0.0) > 0) | (np.nan_to_num(inf_c, nan=0.0) > 0)
        for s in STATS:
            miss = (np.isnan(rows[f"{side}_{s}"].to_numpy(dtype="float64"))
                    & ~np.isnan(rows[f"{other}_{s}"].to_numpy(dtype="float64")) & ~explained)
            hit = paired & miss & np.isnan(full) & ~no_error & ~partial
            reason[hit] = NOT_COMPARED + f"the {side} dump's '{s}' statistic is missing or not a number"
            partial |= hit
    return no_error | partial, reason


def _is_shape(shapes: list[Any]) -> np.ndarray:
    """Per value: a tensor's shape (a tuple or list), as opposed to None/NaN (no tensor)."""
    return np.fromiter((isinstance(s, (tuple, list)) for s in shapes), dtype=bool, count=len(shapes))


def _measured_on_neither_side(rows: Any) -> np.ndarray:
    """Rows whose tensor neither dump measured: no statistic, checksum or saved value on either
    side. The capture describes such tensors without measuring them on purpose (the result of
    ``empty*``, the destination an in-place ``fill_``/``copy_``/``out=`` overwrites: their content is
    uninitialised memory), so there is nothing to compare and nothing was lost. A tensor measured on
    one side only is still "not compared"."""
    n = len(rows)
    measured = np.zeros(n, dtype=bool)
    for side in ("device", "bench"):
        for s in STATS:
            col = f"{side}_{s}"
            if col in rows.columns:
                measured |= ~np.isnan(rows[col].to_numpy(dtype="float64"))
        for col in (f"{side}_md5", f"{side}_value"):
            if col in rows.columns:
                measured |= rows[col].notna().to_numpy()
    return ~measured


def not_values(rows: Any) -> np.ndarray:
    """Per row: a paired tensor that neither dump measured on purpose (uninitialised memory, a
    kernel's scratch workspace such as ``mkldnn_rnn_layer``'s output 3, an overwritten
    destination): it is not a value, so nothing about it is compared - not its numbers, not
    even its shape (a workspace's size depends on the kernel and the dtype)."""
    n = len(rows)
    if not n:
        return np.zeros(0, dtype=bool)
    paired = (rows["match"].to_numpy() != "unmatched") & (rows["kind"].to_numpy(dtype=object) == "tensor")
    return paired & _measured_on_neither_side(rows) & ~_empty_both(rows)


def _empty_both(rows: Any) -> np.ndarray:
    return (numel(rows["device_shape"].tolist()) == 0) & (numel(rows["bench_shape"].tolist()) == 0)


#: reason of the rows :func:`not_values` finds (a deliberate ``skip``, not damage)
NOT_A_VALUE = "not a value (described, not measured: uninitialised memory or a kernel workspace); never compared"


def apply_not_compared(rows: Any) -> int:
    """Mark the rows :func:`not_compared` finds (in place): a ``pass`` or ``skip`` verdict becomes
    ``skip`` with the reason; warnings and errors a checker found stay. Rows that are not values
    (:func:`not_values`) become ``skip`` with :data:`NOT_A_VALUE` whatever a checker said of
    them (a differing workspace size is no error). Returns how many rows were not compared."""
    import pandas as pd

    mask, why = not_compared(rows)
    nv = not_values(rows) & ~mask
    if not mask.any() and not nv.any():
        return 0
    verdict = rows["verdict"].to_numpy(dtype=object).copy()
    reason = rows["reason"].to_numpy(dtype=object).copy()
    who = rows["checker"].to_numpy(dtype=object).copy()
    soft = mask & np.isin(verdict, ["pass", "skip"])
    verdict[soft], reason[soft], who[soft] = "skip", why[soft], ""
    verdict[nv], reason[nv], who[nv] = "skip", NOT_A_VALUE, ""
    rows["verdict"] = pd.Series(verdict, index=rows.index, dtype=object)
    rows["reason"] = pd.Series(reason, index=rows.index, dtype=object)
    rows["checker"] = pd.Series(who, index=rows.index, dtype=object)
    return int(mask.sum())


class _RecordRows:
    """Row positions of each device record, by (step, rank, record id): one grouping, then a
    dictionary lookup per suspect (not a scan of every row per suspect)."""

    def __init__(self, rows: Any, suspects: Sequence[Any]) -> None:
        rid = rows["device_record_id"].to_numpy()
        near = np.flatnonzero(np.isin(rid, np.array(sorted({s.index for s in suspects}), dtype=rid.dtype)))
        step, rank = rows["step"].to_numpy()[near], rows["rank"].to_numpy()[near]
        self.groups: dict[tuple[int, int, int], np.ndarray] = {}
        for k, (a, b, c) in enumerate(zip(step.tolist(), rank.tolist(), rid[near].tolist())):
            self.groups.setdefault((a, b, c), []).append(int(near[k]))  # type: ignore[arg-type]
        self.groups = {k: np.array(v, dtype=np.int64) for k, v in self.groups.items()}
        self.io = rows["io"].to_numpy(dtype=object)
        self.tensor = rows["kind"].to_numpy(dtype=object) == "tensor"
        self.err = rows["error"].to_numpy(dtype="float64")

    def of(self, s: Any) -> np.ndarray:
        """Positions of the rows behind a suspect: its worst output row (an op), or its worst
        entering parameter or input row (a source); all of them when none has an error estimate."""
        idx = self.groups.get((s.step, s.rank, s.index))
        if idx is None:
            return np.empty(0, dtype=np.int64)
        idx = idx[self.tensor[idx]]
        io = self.io[idx]
        idx = idx[np.isin(io, ["output", "grad"])] if s.kind == "op" else \
            idx[io == ("param" if s.kind == "parameter" else "input")]
        e = self.err[idx]
        if len(idx) and (~np.isnan(e)).any():
            idx = idx[e >= np.nanmax(e)]
        return idx


def accepted_by_checkers(rows: Any, suspects: Sequence[Any]) -> list[tuple[Any, str]]:
    """Suspects (ops) whose rows a checker plugin judged ``pass``: a tolerance the user configured
    (a per-op override) accepts that error. Returns (suspect, checker name) pairs."""
    out: list[tuple[Any, str]] = []
    if not len(rows):
        return out
    verdict = rows["verdict"].to_numpy(dtype=object)
    who = rows["checker"].to_numpy(dtype=object)
    ops = [s for s in suspects if s.kind == "op"]
    if not ops:
        return out
    index = _RecordRows(rows, ops)
    for s in ops:
        hit = index.of(s)
        if len(hit) and (verdict[hit] == "pass").all() and all(w not in ("", "builtin") for w in who[hit]):
            out.append((s, str(who[hit][0])))
    return out


def agree_with_suspects(rows: Any, suspects: Sequence[Any]) -> int:
    """Give the rows behind each suspect at least an ``error`` verdict (in place): an op's output
    rows, or for a parameter/input source the entering tensor rows. Returns the rows changed."""
    import pandas as pd

    if not suspects or not len(rows):
        return 0
    verdict = rows["verdict"].to_numpy(dtype=object).copy()
    reason = rows["reason"].to_numpy(dtype=object).copy()
    who = rows["checker"].to_numpy(dtype=object).copy()
    changed = 0
    index = _RecordRows(rows, suspects)
    for s in suspects:
        hit = index.of(s)
        hit = hit[verdict[hit] != "error"]
        if len(hit):
            verdict[hit] = "error"
            reason[hit] = f"root cause analysis: {s.reason}"
            who[hit] = "rootcause"
            changed += len(hit)
    rows["verdict"] = pd.Series(verdict, index=rows.index, dtype=object)
    rows["reason"] = pd.Series(reason, index=rows.index, dtype=object)
    rows["checker"] = pd.Series(who, index=rows.index, dtype=object)
    return changed
