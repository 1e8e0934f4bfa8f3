"""Cell styles: the verdict colours, the shared style objects, and the per (verdict category,
column role) style ids that the streamed Compare cells refer to."""

from __future__ import annotations

import copy
from typing import Any

from ._rows import CATEGORIES

#: Verdict colours (fills that read well with black text). msprobe's graph palette is
#: pass #FFFCF3, warning #FFDC7F, error #FF704D, unmatched #C7C7C7: the Result cell uses those
#: (pass a light green instead of near-white); the rest of a row gets a lighter tint.
RESULT_FILLS = {"pass": "C6EFCE", "warning": "FFDC7F", "error": "FF704D", "unmatched": "C7C7C7", "root": "FF704D"}
ROW_FILLS = {"warning": "FFF2CC", "error": "FCE4D6", "unmatched": "EDEDED", "root": "F8CBAD"}
HEADER_FILL = "1F4E78"

#: style roles of a Compare cell: the Result column, percentage columns, everything else
ROLES = ("plain", "result", "percent")


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


def _register_styles(wb: Any, st: _Styles) -> dict[tuple[str, ...], int]:
    """Register one cell style per (verdict category, column role) in the workbook; return ids.

    The styles are set on cells of a scratch sheet (that is removed again) so openpyxl writes
    them into ``styles.xml``; ``style_id`` is the index the streamed cells refer to.
    """
    scratch = wb.create_sheet("~styles")
    ids: dict[tuple[str, str], int] = {}
    r = 0
    for cat in CATEGORIES:
        for role in ROLES:
            r += 1
            c = scratch.cell(row=r, column=1)
            fill, font = _row_style(cat, role == "result", st)
            if fill is not None:
                c.fill = fill
            if font is not None:
                c.font = font
            if cat == "root":
                c.border = st.root_border
            if role == "percent":
                c.number_format = "0.000%"
            ids[(cat, role)] = c.style_id
            r += 1
            q = scratch.cell(row=r, column=1)
            q._style = copy.copy(c._style)
            q.quotePrefix = True  # formula-like text stays text when edited (see ._text)
            ids[(cat, role, "quoted")] = q.style_id
    wb.remove(scratch)
    return ids


def _row_style(cat: str, is_result: bool, st: _Styles) -> tuple[Any, Any]:
    """(fill, font) of a cell in a row of category ``cat``."""
    if is_result:
        return st.result_fill.get(cat), (st.root_font if cat == "root" else st.bold if cat in ("error", "warning") else None)
    fill = st.row_fill.get(cat)
    font = st.root_font if cat == "root" else st.grey_font if cat == "unmatched" else None
    return fill, font
