"""torchparity Excel reporter: writes ``OUT/compare.xlsx``.

Two sheets:

``Summary`` (first)
    verdict counts, first divergence (step/rank/op/module), root cause with its numbers and a link
    to its rows, the top suspects, and the rest of the result's summary.
``Compare``
    one row per compared tensor, with msprobe-compatible column names (``NPU Name``,
    ``Bench Name``, ``NPU Dtype`` ... ``Cosine``, ``MaxAbsErr``, ... ``Requires_grad Consistent``,
    ``Result``, ``Err_message``, ``NPU_Stack_Info``) followed by torchparity's own columns
    (``Op``, ``Module``, ``Phase``, ``Step``, ``Rank``, ``Match``, ``Amplification`` ...). Only
    columns that carry data for the dump mode are written. Rows are colour-coded by verdict, the
    root cause's rows are highlighted, the header is frozen and has filters. Beyond Excel's
    1,048,575 rows per sheet the rows continue on ``Compare (2)``, ``Compare (3)``...

Speed: openpyxl writes about 60k cells per second, so a 100k-row result (5M cells) would take
minutes. The workbook *frame* (Summary sheet, headers, column widths, frozen panes, filters and
the cell styles) is built with openpyxl; the Compare rows are then streamed straight into the
sheet's XML (one pre-registered style id per verdict and column role, inline strings), which
writes 100k rows in seconds. The result is an ordinary .xlsx that Excel, LibreOffice, openpyxl
and pandas read.

openpyxl and pandas are imported inside functions so plugin discovery stays fast.

This module is the plugin's entry point: it holds the pluggy hook and re-exports the public
names. The work is done in submodules, one job each:

``_reporter``  :class:`XlsxReporter`: options, rows to write, the workbook frame
``_columns``   the Compare columns (:data:`COLUMNS`) and which of them a result gets
``_cells``     cell values: column values, text cleaning, numbers and summary values as cells
``_rows``      each row's verdict category; unmatched and root-cause masks
``_styles``    verdict colours, shared style objects, per-category style ids
``_stream``    the Compare rows streamed as XML into the saved workbook
``_summary``   the Summary sheet
``_text``      untrusted text: formula-like strings, hyperlink formulas
"""

from __future__ import annotations

from typing import Iterator

from torchparity import hookimpl
from torchparity.plugin_types import Reporter

from ._cells import column_values
from ._columns import COLUMNS, Col, select_columns
from ._reporter import EXCEL_MAX_ROWS, XlsxReporter
from ._rows import CATEGORIES
from ._styles import HEADER_FILL, RESULT_FILLS, ROLES, ROW_FILLS
from ._summary import first_divergence
from ._text import MAX_CELL_CHARS

__all__ = [
    "CATEGORIES", "COLUMNS", "EXCEL_MAX_ROWS", "HEADER_FILL", "MAX_CELL_CHARS", "RESULT_FILLS", "ROLES", "ROW_FILLS",
    "Col", "XlsxReporter", "column_values", "first_divergence", "select_columns", "torchparity_reporters",
]

__version__ = "0.1.0"


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield XlsxReporter()
