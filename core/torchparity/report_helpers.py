"""Helpers the reporter plugins share: numbers for people, files replaced in one step, verdict counts.

Re-exported by :mod:`torchparity.plugin_types`, where plugins import them from. Nothing heavy is
imported here: a ``rows`` DataFrame is only used through its own methods.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .errors import PluginError

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import pandas as pd


def format_number(x: Any, spec: str = ".3g", missing: str = "n/a") -> str:
    """``x`` as a number for people: formatted with ``spec`` (3 significant digits by default),
    NaN and infinities spelled out (``NaN``, ``inf``, ``-inf``), ``None`` as ``missing``, and
    anything that is not a number as ``str(x)``."""
    if x is None:
        return missing
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(xf):
        return "NaN"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    return format(xf, spec)


def write_atomically(path: Path, tmp: Path, reporter: str, write: Callable[[Path], object]) -> Path:
    """Write ``path`` through the temporary file ``tmp``: ``write(tmp)``, then ``os.replace(tmp, path)``,
    so a full disk or a crash never leaves half a file at ``path`` (a previous one stays whole).

    An :class:`OSError` removes ``tmp`` (where it can) and raises :class:`PluginError`
    ``reporter '<reporter>': cannot write <path>: <why>``. Returns ``path``.
    """
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise PluginError(f"reporter '{reporter}': cannot write {path}: {exc.strerror or exc}") from None
    return path


def _int_or_zero(x: Any) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return 0


def count_verdict(summary: Mapping[str, Any], rows: pd.DataFrame | None, key: str, verdict: str, *,
                  unmatched_mask: Callable[[pd.DataFrame], Any] | None = None,
                  fall_back_on_bad: bool = False) -> int:
    """How many rows have ``verdict``: ``summary[key]`` where the summary has it, else for
    ``"unmatched"`` the sum of ``n_unmatched_device`` and ``n_unmatched_bench`` where the summary
    has either, else counted in ``rows`` (its ``verdict`` column; 0 without one or without rows).

    ``unmatched_mask``: how unmatched rows are found in ``rows`` (a boolean array or Series per
    row); by default the rows whose ``match`` column is ``"unmatched"`` (none without the column).
    ``fall_back_on_bad``: a summary count that is not a whole number counts as 0 (default), or, when
    true, the count comes from the next source instead (a missing or empty half of the
    device/bench split still counts as 0).
    """
    if summary.get(key) is not None:
        try:
            return int(summary[key])
        except (TypeError, ValueError):
            if not fall_back_on_bad:
                return 0
    if verdict == "unmatched" and ("n_unmatched_device" in summary or "n_unmatched_bench" in summary):
        if not fall_back_on_bad:
            return _int_or_zero(summary.get("n_unmatched_device")) + _int_or_zero(summary.get("n_unmatched_bench"))
        try:
            return int(summary.get("n_unmatched_device") or 0) + int(summary.get("n_unmatched_bench") or 0)
        except (TypeError, ValueError):
            pass
    if rows is None or len(rows) == 0:
        return 0
    if verdict == "unmatched":
        if unmatched_mask is not None:
            return int(unmatched_mask(rows).sum())
        return int(rows["match"].astype(object).eq("unmatched").sum()) if "match" in rows.columns else 0
    return int(rows["verdict"].astype(object).eq(verdict).sum()) if "verdict" in rows.columns else 0
