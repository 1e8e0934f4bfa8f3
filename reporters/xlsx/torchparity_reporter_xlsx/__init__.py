"""torchparity Excel reporter: writes ``OUT/compare.xlsx``.

Two sheets:

``Summary`` (first)
    verdict counts, first divergence (step/rank/op/module), root cause with its numbers and a link
    to its rows, the top suspects, and the rest of the result's summary.
``Compare``
    one row per compared tensor, with msprobe-compatible column names (``NPU Name``,
    ``Bench Name``, ``Cosine``, ``MaxAbsErr``, ... ``Result``, ``Err_message``,
    ``NPU_Stack_Info``) followed by torchparity's own columns (``Op``, ``Module``, ``Phase``,
    ``Step``, ``Rank``, ``Match`` ...). Only columns that carry data for the dump mode are
    written. Rows are colour-coded by verdict, the root cause's rows are highlighted, the header
    is frozen and has filters. Results above ``write_only_rows`` rows are written in openpyxl's
    streaming (write-only) mode, still styled; beyond Excel's 1,048,575 rows per sheet they
    continue on ``Compare (2)``, ``Compare (3)``...

openpyxl and pandas are imported inside methods so plugin discovery stays fast.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from torchparity import hookimpl
from torchparity.errors import PluginError
from torchparity.plugin_types import Reporter

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import CompareResult, Suspect

__version__ = "0.1.0"

EXCEL_MAX_ROWS = 1_048_575  # data rows per sheet (1,048,576 minus the header)
MAX_CELL_CHARS = 32_767

#: Verdict colours (fills that read well with black text). msprobe's graph palette is
#: pass #FFFCF3, warning #FFDC7F, error #FF704D, unmatched #C7C7C7: the Result cell uses those
#: (pass a light green instead of near-white); the rest of a row gets a lighter tint.
RESULT_FILLS = {"pass": "C6EFCE", "warning": "FFDC7F", "error": "FF704D", "unmatched": "C7C7C7", "root": "FF704D"}
ROW_FILLS = {"warning": "FFF2CC", "error": "FCE4D6", "unmatched": "EDEDED", "root": "F8CBAD"}
HEADER_FILL = "1F4E78"


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
    Col("Cosine", ("cosine",)),
    Col("EucDist", ("euc_dist",)),
    Col("MaxAbsErr", ("max_abs_err",)),
    Col("MaxRelativeErr", ("max_rel_err", "max_rel_diff"), "float"),
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
    Col("Worst Index", ("worst_index",), "int", 11),
    Col("NPU NaN", ("device_nan",), "int", 9),
    Col("NPU Inf", ("device_inf",), "int", 9),
    Col("Bench NaN", ("bench_nan",), "int", 9),
    Col("Bench Inf", ("bench_inf",), "int", 9),
    Col("NaN/Inf Mismatch", ("nonfinite_mismatch",), "bool", 10),
    Col("MD5 Equal", ("md5_equal",), "bool", 10),
    Col("NPU_Stack_Info", ("stack",), "stack", 60),
)


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def prepare_output_dir(output_dir: Path | str, reporter: str) -> Path:
    """Create ``output_dir`` (and parents) or raise a :class:`PluginError` that says why not."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise PluginError(f"reporter '{reporter}': output path {out} exists and is not a directory; choose another --output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PluginError(f"reporter '{reporter}': cannot create output directory {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise PluginError(f"reporter '{reporter}': output directory {out} is not writable; choose another --output or fix its permissions")
    return out


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
    return chosen


def _clean_text(s: pd.Series) -> pd.Series:
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    s = s.astype(object).where(s.notna(), None)
    return s.map(lambda v: None if v is None else ILLEGAL_CHARACTERS_RE.sub("", str(v))[:MAX_CELL_CHARS])


def _fmt_list(v: Any, sep: str) -> Any:
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
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
            tensors = rows["tensor"].astype(object).where(rows["tensor"].notna(), None)
            names = pd.Series([f"{a}.{t}" if a is not None and t else a for a, t in zip(names, tensors)], index=rows.index)
        return names.tolist()
    if col.kind == "result":
        vals = s.astype(object).where(s.notna(), None).tolist()
        return ["unmatched" if u else v for v, u in zip(vals, unmatched)]
    if col.kind in ("text", "message"):
        return _clean_text(s).tolist()
    if col.kind == "shape":
        return [_fmt_list(v, ", ") for v in s.tolist()]
    if col.kind == "stack":
        return _clean_text(s.map(lambda v: _fmt_list(v, "\n"))).tolist()
    if col.kind == "bool":
        return [None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else bool(v)
                for v in s.astype(object).tolist()]
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


def _col_letter(i: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(i)


def _fmt_num(x: Any, spec: str = ".3g") -> str:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(xf):
        return "NaN"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    return format(xf, spec)


def _num(x: Any) -> Any:
    """A number rounded to 4 significant digits for display (non-finite ones as text)."""
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return x
    return float(f"{xf:.4g}") if math.isfinite(xf) else _fmt_num(xf)


def _plain(v: Any) -> Any:
    """A summary value as something a cell can hold."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else _fmt_num(v)
    if hasattr(v, "item") and not hasattr(v, "__len__"):
        return _plain(v.item())
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    try:
        return json.dumps(v, default=str)[:MAX_CELL_CHARS]
    except Exception:
        return str(v)[:MAX_CELL_CHARS]


# ------------------------------------------------------------------------------------------
# the workbook
# ------------------------------------------------------------------------------------------


class _Styles:
    """Style objects shared by every cell (openpyxl deduplicates them by value)."""

    def __init__(self) -> None:
        from openpyxl.styles import Alignment, Border, Font, PatternFill, Side

        def fill(c: str) -> PatternFill:
            return PatternFill("solid", start_color=c, end_color=c)

        self.result_fill = {k: fill(c) for k, c in RESULT_FILLS.items()}
        self.row_fill = {k: fill(c) for k, c in ROW_FILLS.items()}
        self.header_fill = fill(HEADER_FILL)
        self.header_font = Font(bold=True, color="FFFFFF")
        self.header_align = Alignment(wrap_text=True, vertical="center")
        self.bold = Font(bold=True)
        self.root_font = Font(bold=True, color="9C0006")
        self.grey_font = Font(color="595959")
        self.title_font = Font(bold=True, size=14)
        self.section_font = Font(bold=True, size=12, color=HEADER_FILL)
        self.link_font = Font(color="0563C1", underline="single")
        self.wrap = Alignment(wrap_text=True, vertical="top")
        self.root_border = Border(top=Side(style="medium", color="C00000"), bottom=Side(style="medium", color="C00000"))


class XlsxReporter(Reporter):
    """``OUT/compare.xlsx``: msprobe-compatible compare sheet plus a Summary sheet."""

    name = "xlsx"
    description = "OUT/compare.xlsx: msprobe-compatible columns, colour-coded by verdict, Summary sheet"

    @dataclass
    class Options:
        #: file name inside the output directory
        filename: str = "compare.xlsx"
        #: results with more rows than this are written in streaming (write-only) mode
        write_only_rows: int = 200_000
        #: write passing rows too (false: only warning, error and unmatched rows)
        include_pass: bool = True
        #: write the call-stack column
        include_stack: bool = True
        #: suspects listed on the Summary sheet
        top_suspects: int = 10

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if not o.filename or Path(o.filename).name != o.filename or not o.filename.endswith(".xlsx"):
            raise PluginError(f"reporter 'xlsx': option filename={o.filename!r} must be a plain file name ending in .xlsx")
        if int(o.write_only_rows) < 0 or int(o.top_suspects) < 0:
            raise PluginError("reporter 'xlsx': write_only_rows and top_suspects must be >= 0")

    # -- entry point ---------------------------------------------------------------------------
    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write ``compare.xlsx`` into ``output_dir``; return ``[path]``."""
        out = prepare_output_dir(output_dir, self.name)
        path = out / self.options.filename
        tmp = path.with_name("~$" + path.name)
        try:
            self._write(result, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise PluginError(f"reporter 'xlsx': cannot write {path}: {exc.strerror or exc}") from None
        return [path]

    # -- implementation --------------------------------------------------------------------------
    def _write(self, result: CompareResult, path: Path) -> None:
        import pandas as pd
        from openpyxl import Workbook

        rows = result.rows if result.rows is not None else pd.DataFrame()
        if not self.options.include_pass and "verdict" in rows.columns:
            keep = rows["verdict"].astype(object).isin(["warning", "error"]) | pd.Series(_unmatched_mask(rows), index=rows.index)
            keep |= pd.Series(_root_mask(rows, result.root_cause), index=rows.index)
            rows = rows[keep]
        rows = rows.reset_index(drop=True)
        if not all(isinstance(c, str) for c in rows.columns):
            rows = rows.rename(columns=str)
        cols = select_columns(rows)
        if not self.options.include_stack:
            cols = [(c, s) for c, s in cols if c.kind != "stack"]
        categories = _categories(rows, result.root_cause)
        root_rows = [i for i, c in enumerate(categories) if c == "root"]

        write_only = len(rows) > min(int(self.options.write_only_rows), EXCEL_MAX_ROWS)
        wb = Workbook(write_only=write_only)
        styles = _Styles()
        if write_only:
            summary_ws = wb.create_sheet("Summary")
        else:
            summary_ws = wb.active
            summary_ws.title = "Summary"
        self._summary_sheet(summary_ws, result, styles, root_rows, write_only, len(rows))
        self._compare_sheets(wb, rows, cols, categories, styles, write_only)
        wb.save(path)

    def _summary_sheet(self, ws: Any, result: CompareResult, st: _Styles, root_rows: list[int],
                       write_only: bool, n_written: int) -> None:
        from openpyxl.cell import WriteOnlyCell

        summary = dict(result.summary or {})
        lines: list[list[Any]] = []  # each item: list of (value, style-dict) or values

        def cell(value: Any, **style: Any) -> Any:
            if not write_only:
                return (value, style)
            c = WriteOnlyCell(ws, value=_plain(value))
            for k, v in style.items():
                setattr(c, k, v)
            return c

        def add(*values: Any) -> None:
            lines.append(list(values))

        try:
            diverged = bool(result.diverged)
        except Exception:
            diverged = result.root_cause is not None
        add(cell("torchparity compare", font=st.title_font))
        verdict_line = "DIVERGED" if diverged else "no divergence"
        n_error = int(summary.get("n_error", 0) or 0)
        if result.root_cause is None and n_error:
            verdict_line = f"{n_error} error rows, no root cause identified"
        add(cell("Verdict", font=st.bold), cell(verdict_line, font=st.root_font if diverged else st.bold))
        for key, label in (("device_dump", "Device dump"), ("bench_dump", "Benchmark dump"), ("mode", "Mode"),
                           ("device_backend", "Device backend"), ("bench_backend", "Benchmark backend")):
            if summary.get(key) is not None:
                add(cell(label, font=st.bold), cell(summary[key]))
        add()
        add(cell("Verdict counts", font=st.section_font))
        add(cell("Verdict", font=st.header_font, fill=st.header_fill), cell("Rows", font=st.header_font, fill=st.header_fill))
        for key, label in (("n_error", "error"), ("n_warning", "warning"), ("n_pass", "pass"),
                           ("n_unmatched", "unmatched"), ("n_skip", "skip")):
            if key in summary:
                fill = st.result_fill.get(label)
                add(cell(label, fill=fill) if fill else cell(label), cell(int(summary[key] or 0)))
        if "n_rows" in summary:
            add(cell("total", font=st.bold), cell(int(summary["n_rows"] or 0), font=st.bold))
        if n_written != int(summary.get("n_rows", n_written) or 0):
            add(cell(f"(the Compare sheet shows {n_written} of them)"))
        add()
        add(cell("First divergence", font=st.section_font))
        fd = summary.get("first_divergence")
        if not fd:
            add(cell("none"))
        elif isinstance(fd, Mapping):
            for k in ("step", "rank", "name", "op", "module", "phase", "index"):
                if fd.get(k) is not None:
                    add(cell(k, font=st.bold), cell(fd[k]))
            for k, v in fd.items():
                if k not in ("step", "rank", "name", "op", "module", "phase", "index"):
                    add(cell(k, font=st.bold), cell(v))
        else:
            add(cell(fd))
        add()
        add(cell("Root cause", font=st.section_font))
        rc = result.root_cause
        if rc is None:
            add(cell("none identified" + (f" ({n_error} rows are errors: filter Result = error on the Compare sheet)" if n_error else "")))
        else:
            if root_rows:
                target = f"#'Compare'!A{root_rows[0] + 2}"
                add(cell("name", font=st.bold), cell(f'=HYPERLINK("{target}","{rc.name}")', font=st.link_font))
            else:
                add(cell("name", font=st.bold), cell(rc.name))
            for label, value in (("op", rc.op), ("module", rc.module), ("phase", rc.phase), ("step", rc.step),
                                 ("rank", rc.rank), ("kind", rc.kind),
                                 ("amplification (output err / input err)", _num(rc.score)),
                                 ("input error", _num(rc.input_error)), ("output error", _num(rc.output_error)),
                                 ("reason", rc.reason)):
                add(cell(label, font=st.bold), cell(value))
        add()
        suspects = list(result.suspects or [])[: int(self.options.top_suspects)]
        add(cell("Suspects", font=st.section_font))
        if not suspects:
            add(cell("none"))
        else:
            hdr = ("#", "Name", "Op", "Module", "Phase", "Step", "Rank", "Amplification", "Input err", "Output err", "Reason")
            add(*[cell(h, font=st.header_font, fill=st.header_fill) for h in hdr])
            for i, s in enumerate(suspects, 1):
                add(cell(i), cell(s.name), cell(s.op), cell(s.module), cell(s.phase), cell(s.step), cell(s.rank),
                    cell(_num(s.score)), cell(_num(s.input_error)), cell(_num(s.output_error)), cell(s.reason))
        shown = {"device_dump", "bench_dump", "mode", "device_backend", "bench_backend", "n_error", "n_warning",
                 "n_pass", "n_unmatched", "n_skip", "n_rows", "first_divergence"}
        rest = {k: v for k, v in summary.items() if k not in shown}
        if rest:
            add()
            add(cell("Details", font=st.section_font))
            for k, v in rest.items():
                add(cell(str(k), font=st.bold), cell(v))

        widths = {"A": 38, "B": 34, "C": 22, "D": 26, "E": 11, "F": 7, "G": 7, "H": 14, "I": 11, "J": 11, "K": 60}
        for letter, w in widths.items():
            ws.column_dimensions[letter].width = w
        if write_only:
            for line in lines:
                ws.append(line)
            return
        for r, line in enumerate(lines, 1):
            for c, (value, style) in enumerate(line, 1):
                x = ws.cell(row=r, column=c, value=_plain(value))
                for k, v in style.items():
                    setattr(x, k, v)

    def _compare_sheets(self, wb: Any, rows: pd.DataFrame, cols: list[tuple[Col, str | None]],
                        categories: list[str], st: _Styles, write_only: bool) -> None:
        unmatched = _unmatched_mask(rows)
        values = [column_values(rows, c, s, unmatched) for c, s in cols]
        headers = [c.header for c, _ in cols]
        result_idx = headers.index("Result")
        msg_idx = headers.index("Err_message")
        percent_idx = {i for i, (_, src) in enumerate(cols) if src is not None and src.endswith("_rel_diff")}
        n = len(rows)
        per_sheet = EXCEL_MAX_ROWS
        n_sheets = max(1, math.ceil(n / per_sheet))
        for k in range(n_sheets):
            title = "Compare" if k == 0 else f"Compare ({k + 1})"
            ws = wb.create_sheet(title)
            lo, hi = k * per_sheet, min(n, (k + 1) * per_sheet)
            for i, (c, _) in enumerate(cols, 1):
                ws.column_dimensions[_col_letter(i)].width = c.width
            ws.freeze_panes = "B2"
            last = _col_letter(len(cols))
            ws.auto_filter.ref = f"A1:{last}{max(hi - lo + 1, 1)}"
            if write_only:
                self._rows_write_only(ws, headers, values, categories, lo, hi, result_idx, msg_idx, percent_idx, st)
            else:
                self._rows_normal(ws, headers, values, categories, lo, hi, result_idx, msg_idx, percent_idx, st)

    @staticmethod
    def _row_style(cat: str, j: int, result_idx: int, st: _Styles) -> tuple[Any, Any]:
        """(fill, font) of column ``j`` in a row of category ``cat``."""
        if j == result_idx:
            return st.result_fill.get(cat), (st.root_font if cat == "root" else st.bold if cat in ("error", "warning") else None)
        fill = st.row_fill.get(cat)
        font = st.root_font if cat == "root" else st.grey_font if cat == "unmatched" else None
        return fill, font

    def _rows_normal(self, ws: Any, headers: list[str], values: list[list[Any]], categories: list[str],
                     lo: int, hi: int, result_idx: int, msg_idx: int, percent_idx: set[int], st: _Styles) -> None:
        ws.append(headers)
        for cell in ws[1]:
            cell.font, cell.fill, cell.alignment = st.header_font, st.header_fill, st.header_align
        ws.row_dimensions[1].height = 30
        ncol = len(headers)
        for r in range(lo, hi):
            row = [values[j][r] for j in range(ncol)]
            cat = categories[r]
            if cat == "root":
                row[msg_idx] = f"ROOT CAUSE: {row[msg_idx]}" if row[msg_idx] else "ROOT CAUSE"
            ws.append(row)
            excel_row = ws.max_row
            if percent_idx:
                for j in percent_idx:
                    if isinstance(row[j], float):
                        ws.cell(row=excel_row, column=j + 1).number_format = "0.000%"
            if cat in ("pass", "skip"):
                if cat == "pass":
                    c = ws.cell(row=excel_row, column=result_idx + 1)
                    c.fill = st.result_fill["pass"]
                continue
            for j in range(ncol):
                fill, font = self._row_style(cat, j, result_idx, st)
                c = ws.cell(row=excel_row, column=j + 1)
                if fill is not None:
                    c.fill = fill
                if font is not None:
                    c.font = font
                if cat == "root":
                    c.border = st.root_border

    def _rows_write_only(self, ws: Any, headers: list[str], values: list[list[Any]], categories: list[str],
                         lo: int, hi: int, result_idx: int, msg_idx: int, percent_idx: set[int], st: _Styles) -> None:
        from openpyxl.cell import WriteOnlyCell

        hdr = []
        for h in headers:
            c = WriteOnlyCell(ws, value=h)
            c.font, c.fill, c.alignment = st.header_font, st.header_fill, st.header_align
            hdr.append(c)
        ws.append(hdr)
        ncol = len(headers)
        for r in range(lo, hi):
            row: list[Any] = [values[j][r] for j in range(ncol)]
            cat = categories[r]
            if cat == "root":
                row[msg_idx] = f"ROOT CAUSE: {row[msg_idx]}" if row[msg_idx] else "ROOT CAUSE"
            if cat in ("pass", "skip"):
                if cat == "pass":
                    c = WriteOnlyCell(ws, value=row[result_idx])
                    c.fill = st.result_fill["pass"]
                    row[result_idx] = c
            else:
                for j in range(ncol):
                    fill, font = self._row_style(cat, j, result_idx, st)
                    c = WriteOnlyCell(ws, value=row[j])
                    if fill is not None:
                        c.fill = fill
                    if font is not None:
                        c.font = font
                    if cat == "root":
                        c.border = st.root_border
                    row[j] = c
            for j in percent_idx:
                v = row[j]
                if isinstance(v, float):
                    c = WriteOnlyCell(ws, value=v)
                    c.number_format = "0.000%"
                    row[j] = c
                elif hasattr(v, "number_format") and isinstance(v.value, float):
                    v.number_format = "0.000%"
            ws.append(row)


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield XlsxReporter()
