"""Row classification: each Compare row's verdict category (pass, warning, error, skip,
unmatched, root) and the masks of unmatched and root-cause rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import Suspect

#: the verdict categories a Compare row can fall in (each gets its own cell styles)
CATEGORIES = ("skip", "pass", "warning", "error", "unmatched", "root")


def _categories(rows: pd.DataFrame, root: Suspect | None) -> list[str]:
    """Per row: error | warning | pass | skip | unmatched | root."""
    import numpy as np

    n = len(rows)
    cat = np.array(["skip"] * n, dtype=object)
    if "verdict" in rows.columns:
        v = rows["verdict"].astype(object).to_numpy()
        for name in ("pass", "warning", "error"):
            cat[v == name] = name
    um = _unmatched_mask(rows)
    cat[um] = "unmatched"
    rm = _root_mask(rows, root)
    cat[rm] = "root"
    return cat.tolist()


def _unmatched_mask(rows: pd.DataFrame) -> Any:
    import numpy as np

    if "match" in rows.columns:
        return rows["match"].astype(object).eq("unmatched").to_numpy(dtype=bool)
    if "bench_name" in rows.columns:
        return rows["bench_name"].isna().to_numpy(dtype=bool)
    return np.zeros(len(rows), dtype=bool)


def _root_mask(rows: pd.DataFrame, root: Suspect | None) -> Any:
    import numpy as np

    mask = np.zeros(len(rows), dtype=bool)
    if root is None or "device_name" not in rows.columns:
        return mask
    m = rows["device_name"].astype(object).eq(root.name)
    for col, val in (("step", root.step), ("rank", root.rank)):
        if col in rows.columns and val is not None:
            m &= rows[col].eq(val) | rows[col].isna()
    return m.fillna(False).to_numpy(dtype=bool)
