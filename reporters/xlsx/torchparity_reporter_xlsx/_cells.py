"""Cell values: a Compare column's values (vectorised), text cleaning, numbers and lists as text,
and summary values as something a cell can hold."""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any

from torchparity.plugin_types import format_number

from ._text import MAX_CELL_CHARS, cell_text

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ._columns import Col


def _clean_text(s: pd.Series) -> list[Any]:
    """Text cells: missing values (None, NaN, pd.NA) as empty cells, illegal XML characters removed."""
    import pandas as pd
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    vals = s.astype(object).tolist()
    missing = pd.isna(s).to_numpy(dtype=bool)
    return [None if m else ILLEGAL_CHARACTERS_RE.sub("", str(v))[:MAX_CELL_CHARS] for v, m in zip(vals, missing)]


def _is_missing(v: Any) -> bool:
    """None, NaN, pd.NA, NaT: a scalar that means "no value" (lists are never missing)."""
    if v is None:
        return True
    if isinstance(v, (str, bytes, list, tuple, dict)) or hasattr(v, "__len__"):
        return False
    try:
        import pandas as pd

        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _fmt_list(v: Any, sep: str) -> Any:
    """A list (shape, index, stack) as text: ``[16, 64]`` or one frame per line."""
    if _is_missing(v):
        return None
    if isinstance(v, str):
        return v
    try:
        items = list(v)
    except TypeError:
        return str(v)
    return sep.join(str(x) for x in items) if sep == "\n" else "[" + ", ".join(str(x) for x in items) + "]"


def column_values(rows: pd.DataFrame, col: Col, src: str | None, unmatched: Any) -> list[Any]:
    """The cell values of one output column (vectorised per column)."""
    import numpy as np
    import pandas as pd

    n = len(rows)
    if src is None:
        return [None] * n
    s = rows[src]
    if col.kind == "name":
        names = _clean_text(s)
        if "tensor" in rows.columns:
            tensors = _clean_text(rows["tensor"])
            names = [f"{a}.{t}" if a is not None and t else a for a, t in zip(names, tensors)]
        return names
    if col.kind == "result":
        vals = _clean_text(s)
        return ["unmatched" if u else v for v, u in zip(vals, unmatched)]
    if col.kind in ("text", "message"):
        return _clean_text(s)
    if col.kind == "shape":
        return [_fmt_list(v, ", ") for v in s.astype(object).tolist()]
    if col.kind == "stack":
        return _clean_text(s.astype(object).map(lambda v: _fmt_list(v, "\n")))
    if col.kind == "bool":
        missing = pd.isna(s).to_numpy(dtype=bool)
        return [None if m else bool(v) for v, m in zip(s.astype(object).tolist(), missing)]
    if col.kind == "int":
        arr = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        return [int(v) if math.isfinite(v) else None for v in arr.tolist()]
    # numbers: non-finite values as text ("NaN", "inf"), nothing at all for unmatched rows
    arr = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    out = arr.astype(object)
    bad = ~np.isfinite(arr)
    if bad.any():
        out[np.isnan(arr)] = "NaN"
        out[np.isposinf(arr)] = "inf"
        out[np.isneginf(arr)] = "-inf"
        if unmatched is not None:
            out[np.asarray(unmatched, dtype=bool) & np.isnan(arr)] = None
    return out.tolist()


def _fmt_num(x: Any, spec: str = ".3g") -> str:
    """A number as text (NaN/inf spelled out); ``None`` as ``"None"``, as ``str(None)`` always was here."""
    return format_number(x, spec, missing="None")


def _num(x: Any) -> Any:
    """A number rounded to 4 significant digits for display (non-finite ones as text)."""
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return x
    return float(f"{xf:.4g}") if math.isfinite(xf) else _fmt_num(xf)


def _plain(v: Any) -> Any:
    """A summary value as something a cell can hold (text: see :mod:`._text`)."""
    if isinstance(v, str):
        return cell_text(v)
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else _fmt_num(v)
    if hasattr(v, "item") and not hasattr(v, "__len__"):
        return _plain(v.item())
    if isinstance(v, os.PathLike):
        return cell_text(os.fspath(v))
    try:
        return cell_text(json.dumps(v, default=str))
    except Exception:
        return cell_text(str(v))
