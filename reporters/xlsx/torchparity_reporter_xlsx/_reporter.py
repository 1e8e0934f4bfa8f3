"""The reporter: :class:`XlsxReporter`'s options, and writing ``compare.xlsx`` (rows to write,
the workbook frame, then the streamed Compare rows)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from torchparity.errors import PluginError
from torchparity.plugin_types import Reporter, prepare_output_dir, write_atomically

from ._cells import column_values
from ._columns import Col, _col_letter, select_columns
from ._rows import CATEGORIES, _categories, _root_mask, _unmatched_mask
from ._stream import _stream_rows
from ._styles import _register_styles, _Styles
from ._summary import _summary_sheet

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import CompareResult

EXCEL_MAX_ROWS = 1_048_575  # data rows per sheet (1,048,576 minus the header)


class XlsxReporter(Reporter):
    """``OUT/compare.xlsx``: msprobe-compatible compare sheet plus a Summary sheet."""

    name = "xlsx"
    description = "OUT/compare.xlsx: msprobe-compatible columns, colour-coded by verdict, Summary sheet"

    @dataclass
    class Options:
        #: file name inside the output directory
        filename: str = "compare.xlsx"
        #: write passing rows too (false: only warning, error, unmatched and root-cause rows)
        include_pass: bool = True
        #: write the call-stack column
        include_stack: bool = True
        #: suspects listed on the Summary sheet
        top_suspects: int = 10
        #: zlib level of the .xlsx (1 = fastest; 6 = smaller files, about 2x slower for big results)
        compress_level: int = 1
        #: data rows per Compare sheet (Excel's maximum by default; lower it to split big results)
        max_rows_per_sheet: int = EXCEL_MAX_ROWS

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if not o.filename or Path(o.filename).name != o.filename or not o.filename.endswith(".xlsx"):
            raise PluginError(f"reporter 'xlsx': option filename={o.filename!r} must be a plain file name ending in .xlsx")
        if int(o.top_suspects) < 0:
            raise PluginError("reporter 'xlsx': top_suspects must be >= 0")
        if not 0 <= int(o.compress_level) <= 9:
            raise PluginError("reporter 'xlsx': compress_level must be between 0 and 9")
        if not 1 <= int(o.max_rows_per_sheet) <= EXCEL_MAX_ROWS:
            raise PluginError(f"reporter 'xlsx': max_rows_per_sheet must be between 1 and {EXCEL_MAX_ROWS}")

    # -- entry point ---------------------------------------------------------------------------
    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write ``compare.xlsx`` into ``output_dir``; return ``[path]``."""
        out = prepare_output_dir(output_dir, self.name)
        path = out / self.options.filename
        write_atomically(path, path.with_name("~$" + path.name), "xlsx", lambda tmp: self._write(result, tmp))
        return [path]

    # -- implementation --------------------------------------------------------------------------
    def _prepare_rows(self, result: CompareResult) -> pd.DataFrame:
        import pandas as pd

        rows = result.rows if result.rows is not None else pd.DataFrame()
        if not self.options.include_pass and "verdict" in rows.columns:
            keep = rows["verdict"].astype(object).isin(["warning", "error"]).to_numpy(dtype=bool)
            keep = keep | _unmatched_mask(rows) | _root_mask(rows, result.root_cause)
            rows = rows[keep]
        rows = rows.reset_index(drop=True)
        if not all(isinstance(c, str) for c in rows.columns):
            rows = rows.rename(columns=str)
        if {"device_requires_grad", "bench_requires_grad"} <= set(rows.columns):
            d, b = rows["device_requires_grad"], rows["bench_requires_grad"]
            both = (d.notna() & b.notna()).to_numpy(dtype=bool)
            same = (d.astype(object) == b.astype(object)).to_numpy(dtype=bool)
            rows = rows.assign(_requires_grad_consistent=[bool(s) if k else None for s, k in zip(same, both)])
        return rows

    def _write(self, result: CompareResult, path: Path) -> None:
        import io

        from openpyxl import Workbook

        rows = self._prepare_rows(result)
        cols = select_columns(rows)
        if not self.options.include_stack:
            cols = [(c, s) for c, s in cols if c.kind != "stack"]
        categories = _categories(rows, result.root_cause)
        per_sheet = int(self.options.max_rows_per_sheet)
        root_rows = [i for i, c in enumerate(categories) if c == "root"]

        wb = Workbook()
        st = _Styles()
        summary_ws = wb.active
        summary_ws.title = "Summary"
        _summary_sheet(summary_ws, result, st, root_rows, len(rows), per_sheet, self.options.top_suspects)
        headers = [c.header for c, _ in cols]
        n = len(rows)
        sheets = []
        for k in range(max(1, math.ceil(n / per_sheet))):
            ws = wb.create_sheet("Compare" if k == 0 else f"Compare ({k + 1})")
            lo, hi = k * per_sheet, min(n, (k + 1) * per_sheet)
            ws.append(headers)
            for cell in ws[1]:
                cell.font, cell.fill, cell.alignment = st.header_font, st.header_fill, st.header_align
            ws.row_dimensions[1].height = 30
            for i, (c, _) in enumerate(cols, 1):
                ws.column_dimensions[_col_letter(i)].width = c.width
            ws.freeze_panes = "B2"
            ws.auto_filter.ref = f"A1:{_col_letter(len(cols))}{max(hi - lo + 1, 1)}"
            sheets.append((ws, lo, hi))
        style_ids = _register_styles(wb, st)

        frame = io.BytesIO()
        wb.save(frame)
        parts = {ws.path.lstrip("/"): (lo, hi) for ws, lo, hi in sheets}
        values = self._values(rows, cols, categories) if n else []
        roles = ["result" if c.kind == "result" else "percent" if src is not None and src.endswith("_rel_diff") else "plain"
                 for c, src in cols]
        row_styles = {cat: [style_ids[(cat, r)] for r in roles] for cat in CATEGORIES}
        quoted = {cat: [style_ids[(cat, r, "quoted")] for r in roles] for cat in CATEGORIES}
        _stream_rows(frame, path, parts, values, categories, row_styles, quoted, len(cols),
                     int(self.options.compress_level))

    @staticmethod
    def _values(rows: pd.DataFrame, cols: list[tuple[Col, str | None]], categories: list[str]) -> list[list[Any]]:
        """Cell values column by column; root-cause and unmatched rows get an explaining message."""
        unmatched = _unmatched_mask(rows)
        values = [column_values(rows, c, s, unmatched) for c, s in cols]
        headers = [c.header for c, _ in cols]
        msg = values[headers.index("Err_message")]
        bench_missing = rows["bench_name"].isna().to_numpy(dtype=bool) if "bench_name" in rows.columns else unmatched
        for i, cat in enumerate(categories):
            if cat == "root":
                msg[i] = f"ROOT CAUSE: {msg[i]}" if msg[i] else "ROOT CAUSE"
            elif cat == "unmatched" and not msg[i]:
                msg[i] = "only in the device dump: no benchmark record" if bench_missing[i] else \
                    "only in the benchmark dump: no device record"
        return values
