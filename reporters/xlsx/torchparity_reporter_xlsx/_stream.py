"""Streaming the Compare rows: cells as ``<c>`` XML, rows in chunks, spliced into the sheet
parts of the workbook frame that openpyxl saved."""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path
from typing import IO, Any

from torchparity.errors import PluginError

from ._cells import _fmt_num
from ._columns import _col_letter
from ._text import FORMULA_TRIGGERS

_XML_ESCAPE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\r": "&#13;"})  # CR: XML would read it as LF
_DIMENSION_RE = re.compile(r'<dimension ref="[^"]*"\s*/>')
#: rows of XML generated per write (bounds the memory of the streamed part)
_CHUNK_ROWS = 4096


def _cell_xml(v: Any, s: int) -> str:
    """One ``<c>`` element: a number, a boolean, an inline string, or an empty (styled) cell.

    Cells carry no ``r`` reference: they are positional, so every column gets an element.
    """
    if v is None:
        return f'<c s="{s}"/>'
    t = type(v)
    if t is float:
        if v != v or v in (math.inf, -math.inf):  # column_values already spells these out
            return f'<c s="{s}" t="inlineStr"><is><t>{_fmt_num(v)}</t></is></c>'
        return f'<c s="{s}"><v>{v!r}</v></c>'
    if t is bool:
        return f'<c s="{s}" t="b"><v>{int(v)}</v></c>'
    if t is int:
        return f'<c s="{s}"><v>{v}</v></c>'
    if t is not str:
        if isinstance(v, bool):
            return f'<c s="{s}" t="b"><v>{int(v)}</v></c>'
        if isinstance(v, (int, float)):
            return _cell_xml(float(v) if isinstance(v, float) else int(v), s)
        v = str(v)
    return f'<c s="{s}" t="inlineStr"><is><t xml:space="preserve">{v.translate(_XML_ESCAPE)}</t></is></c>'


def _stream_rows(frame: IO[bytes], path: Path, parts: dict[str, tuple[int, int]], values: list[list[Any]],
                 categories: list[str], row_styles: dict[str, list[int]], quoted: dict[str, list[int]],
                 n_cols: int, compress_level: int) -> None:
    """Copy the workbook ``frame`` (saved by openpyxl) to ``path``, streaming rows ``lo..hi`` of
    ``values`` into each sheet part named in ``parts`` (part name -> ``(lo, hi)``)."""
    last_col = _col_letter(n_cols)
    with zipfile.ZipFile(frame) as zin, zipfile.ZipFile(
            path, "w", zipfile.ZIP_DEFLATED, compresslevel=compress_level, allowZip64=True) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename not in parts:
                zout.writestr(info, data)
                continue
            lo, hi = parts[info.filename]
            xml = data.decode("utf-8")
            cut = xml.rfind("</sheetData>")
            if cut < 0:  # pragma: no cover - openpyxl always writes the header row
                raise PluginError("reporter 'xlsx': unexpected worksheet layout from openpyxl")
            head = _DIMENSION_RE.sub(f'<dimension ref="A1:{last_col}{hi - lo + 1}"/>', xml[:cut], count=1)
            zinfo = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            with zout.open(zinfo, "w", force_zip64=(hi - lo) > 100_000) as fh:
                fh.write(head.encode("utf-8"))
                for a in range(lo, hi, _CHUNK_ROWS):
                    fh.write(_rows_xml(values, categories, row_styles, a, min(hi, a + _CHUNK_ROWS), a - lo + 2,
                                       quoted))
                fh.write(xml[cut:].encode("utf-8"))


def _rows_xml(values: list[list[Any]], categories: list[str], row_styles: dict[str, list[int]],
              lo: int, hi: int, first_row: int, quoted: dict[str, list[int]] | None = None) -> bytes:
    """Rows ``lo..hi`` as ``<row>`` XML, built column by column (one type dispatch per cell).

    Strings are inline-string cells (text, never formulas); formula-like ones (see
    :mod:`._text`) use the ``quoted`` style ids, which carry ``quotePrefix``."""
    cats = categories[lo:hi]
    columns = []
    quoted = quoted or row_styles
    triggers = FORMULA_TRIGGERS
    for j, vals in enumerate(values):
        prefix = {cat: f'<c s="{ids[j]}"' for cat, ids in row_styles.items()}
        qprefix = {cat: f'<c s="{ids[j]}"' for cat, ids in quoted.items()}
        cells = []
        add = cells.append
        for v, cat in zip(vals[lo:hi], cats):
            p = prefix[cat]
            t = type(v)
            if t is float and v - v == 0.0:
                add(f"{p}><v>{v!r}</v></c>")
            elif v is None:
                add(p + "/>")
            elif t is str:
                if v[:1] in triggers:
                    p = qprefix[cat]
                add(f'{p} t="inlineStr"><is><t xml:space="preserve">{v.translate(_XML_ESCAPE)}</t></is></c>')
            elif t is int:
                add(f"{p}><v>{v}</v></c>")
            else:
                add(_cell_xml(v, row_styles[cat][j]))
        columns.append(cells)
    return "".join([f'<row r="{r}">{"".join(cells)}</row>'
                    for r, cells in zip(range(first_row, first_row + hi - lo), zip(*columns))]).encode("utf-8")
