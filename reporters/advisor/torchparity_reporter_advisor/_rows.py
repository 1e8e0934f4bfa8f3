"""Reading a comparison for the advisor: counts, the root cause's rows, one-line rows, the replay case.

Works on a :class:`~torchparity.results.CompareResult`'s ``rows`` (a pandas DataFrame, or None)
and ``summary``; pandas is only imported for type checking.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from torchparity.plugin_types import count_verdict
from torchparity.results import complete_first_divergence

from ._text import _get, _int, _where, fmt

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import Suspect


def _rows_records(rows: pd.DataFrame | None, mask: Any) -> list[dict[str, Any]]:
    if rows is None or len(rows) == 0:
        return []
    return rows[mask].to_dict("records")


def _root_rows(rows: pd.DataFrame | None, rc: Suspect) -> list[dict[str, Any]]:
    if rows is None or len(rows) == 0 or "device_name" not in rows.columns:
        return []
    m = rows["device_name"].astype(object).eq(rc.name)
    for col, val in (("step", rc.step), ("rank", rc.rank)):
        if col in rows.columns:
            m &= rows[col].eq(val) | rows[col].isna()
    return _rows_records(rows, m.fillna(False).astype(bool))


def _tensor_line(r: Mapping[str, Any]) -> str:
    """One tensor of an op with the metrics it has."""
    parts = [str(_get(r, "tensor") or _get(r, "io") or "?")]
    dtype = _get(r, "device_dtype")
    bdtype = _get(r, "bench_dtype")
    shape = _get(r, "device_shape")
    if dtype:
        parts.append(f"{dtype}" + (f" (bench {bdtype})" if bdtype and bdtype != dtype else ""))
    if shape is not None:
        parts.append("shape " + (str(list(shape)) if not isinstance(shape, str) else shape))
    for key, label, spec in (("rel_l2", "rel err", ".3g"), ("cosine", "cosine", ".6f"), ("max_abs_err", "max abs err", ".3g"),
                             ("max_rel_err", "max rel err", ".3g"), ("one_thousandth_ratio", "1/1000 ratio", ".3g"),
                             ("norm_rel_diff", "norm rel diff", ".3g")):
        v = _get(r, key)
        if v is not None:
            parts.append(f"{label} {fmt(v, spec)}")
    nan = _int(_get(r, "device_nan")) + _int(_get(r, "device_inf"))
    bnan = _int(_get(r, "bench_nan")) + _int(_get(r, "bench_inf"))
    if nan or bnan:
        parts.append(f"NaN/Inf: device {nan}, bench {bnan}")
    verdict = _get(r, "verdict")
    if verdict:
        parts.append(f"-> {verdict}")
    return ", ".join(parts)


def _row_label(r: Mapping[str, Any]) -> str:
    name = _get(r, "device_name") or _get(r, "bench_name") or "?"
    tensor = _get(r, "tensor")
    label = f"{name}.{tensor}" if tensor else str(name)
    where = _where(_get(r, "step"), _get(r, "rank"), None)
    mod = _get(r, "module")
    extra = ", ".join(x for x in (f"module {mod}" if mod else "", where) if x)
    return f"{label} ({extra})" if extra else label


#: a verdict count from the summary (``n_unmatched`` may be split into device/bench) or the rows
#: (``_count(summary, rows, key, verdict)``; a summary count that is not a whole number counts as 0)
_count = count_verdict


first_divergence = complete_first_divergence  # shared with the other reporters (torchparity.results)


def _replay_case(summary: Mapping[str, Any], rc: Suspect | None) -> str | None:
    """A replay case path the compare recorded for the root cause, if any."""
    for key in ("replay_case", "replay_cases", "cases"):
        v = summary.get(key)
        if not v:
            continue
        if isinstance(v, (str, os.PathLike)):
            return os.fspath(v)
        if isinstance(v, Mapping):
            if rc is not None and rc.name in v:
                return os.fspath(v[rc.name])
            first = next(iter(v.values()), None)
            return os.fspath(first) if first else None
        if isinstance(v, Sequence) and len(v):
            return os.fspath(v[0])
    return None
