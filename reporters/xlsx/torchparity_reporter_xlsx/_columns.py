"""The Compare sheet's columns: their specs (:data:`COLUMNS`), which of them a result gets, and
their letters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


@dataclass(frozen=True)
class Col:
    """One output column: its header, the row columns it reads (first with data wins), its kind."""

    header: str
    sources: tuple[str, ...]
    kind: str = "float"  # name | text | shape | float | percent | int | result | message | stack | bool
    width: float = 13
    always: bool = False


#: The Compare sheet's columns in order: msprobe's names first, then torchparity's own.
COLUMNS: tuple[Col, ...] = (
    Col("NPU Name", ("device_name",), "name", 46, always=True),
    Col("Bench Name", ("bench_name",), "name", 46, always=True),
    Col("NPU Dtype", ("device_dtype",), "text", 11),
    Col("Bench Dtype", ("bench_dtype",), "text", 11),
    Col("NPU Tensor Shape", ("device_shape",), "shape", 17),
    Col("Bench Tensor Shape", ("bench_shape",), "shape", 17),
    Col("NPU Requires_grad", ("device_requires_grad",), "bool", 10),
    Col("Bench Requires_grad", ("bench_requires_grad",), "bool", 10),
    Col("Cosine", ("cosine",)),
    Col("EucDist", ("euc_dist",)),
    Col("MaxAbsErr", ("max_abs_err",)),
    Col("MaxRelativeErr", ("max_rel_err",), "float"),
    Col("One Thousandth Err Ratio", ("one_thousandth_ratio",)),
    Col("Five Thousandths Err Ratio", ("five_thousandth_ratio",)),
    Col("Max diff", ("max_diff",)),
    Col("Min diff", ("min_diff",)),
    Col("Mean diff", ("mean_diff",)),
    Col("L2norm diff", ("norm_diff",)),
    Col("MaxRelativeErr (stats)", ("max_rel_diff",), "percent"),
    Col("MinRelativeErr", ("min_rel_diff",), "percent"),
    Col("MeanRelativeErr", ("mean_rel_diff",), "percent"),
    Col("NormRelativeErr", ("norm_rel_diff",), "percent"),
    Col("NPU max", ("device_max",)),
    Col("NPU min", ("device_min",)),
    Col("NPU mean", ("device_mean",)),
    Col("NPU l2norm", ("device_norm",)),
    Col("Bench max", ("bench_max",)),
    Col("Bench min", ("bench_min",)),
    Col("Bench mean", ("bench_mean",)),
    Col("Bench l2norm", ("bench_norm",)),
    Col("NPU MD5", ("device_md5",), "text", 12),
    Col("BENCH MD5", ("bench_md5",), "text", 12),
    Col("Requires_grad Consistent", ("_requires_grad_consistent",), "bool", 11),
    Col("Result", ("verdict",), "result", 11, always=True),
    Col("Err_message", ("reason",), "message", 44, always=True),
    # torchparity's own columns
    Col("Op", ("op",), "text", 26),
    Col("Module", ("module",), "text", 30),
    Col("Phase", ("phase",), "text", 10),
    Col("Step", ("step",), "int", 7),
    Col("Rank", ("rank",), "int", 7),
    Col("Order", ("order",), "int", 8),
    Col("IO", ("io",), "text", 8),
    Col("Match", ("match",), "text", 11),
    Col("Checker", ("checker",), "text", 12),
    Col("RelL2Err", ("rel_l2",)),
    Col("MeanRelErr", ("mean_rel_err",)),
    Col("RMSE", ("rmse",)),
    Col("Amplification", ("amplification",)),
    Col("Input Err", ("input_error",)),
    Col("Worst Index", ("worst_index",), "shape", 11),
    Col("NPU NaN", ("device_nan",), "int", 9),
    Col("NPU Inf", ("device_inf",), "int", 9),
    Col("Bench NaN", ("bench_nan",), "int", 9),
    Col("Bench Inf", ("bench_inf",), "int", 9),
    Col("NaN/Inf Mismatch", ("nonfinite_mismatch",), "bool", 10),
    Col("MD5 Equal", ("md5_equal",), "bool", 10),
    Col("Note", ("note",), "message", 30),
    Col("NPU_Stack_Info", ("stack",), "stack", 60),
)


def _has_data(s: pd.Series) -> bool:
    import pandas as pd

    vals = s.dropna()
    if vals.empty:
        return False
    if s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
        return bool(vals.map(lambda v: not (isinstance(v, str) and v == "")).any())
    return True


def select_columns(rows: pd.DataFrame) -> list[tuple[Col, str | None]]:
    """The columns to write for this result: ``(spec, source column)``; source None = empty."""
    present = {c for c in rows.columns if _has_data(rows[c])}
    chosen: list[tuple[Col, str | None]] = []
    used: set[str] = set()
    for col in COLUMNS:
        src = next((s for s in col.sources if s in present and s not in used), None)
        if src is None and not col.always:
            continue
        if src is not None:
            used.add(src)
        chosen.append((col, src))
    headers = {c.header for c, _ in chosen}
    if "MaxRelativeErr" not in headers:
        # statistics mode: msprobe calls the statistics' relative max error "MaxRelativeErr"
        chosen = [(dataclasses.replace(c, header="MaxRelativeErr") if c.header == "MaxRelativeErr (stats)" else c, s)
                  for c, s in chosen]
    return chosen


def _col_letter(i: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(i)
