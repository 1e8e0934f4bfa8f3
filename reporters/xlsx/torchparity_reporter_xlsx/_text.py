"""Untrusted text in the workbook: op, module and file names come from the dumped model.

The rule (docs/reports.md): every text cell is written as a *string* cell, never a formula, and a
string that a spreadsheet could take for a formula when it is edited, re-typed or pasted as CSV
(first character ``=``, ``+``, ``-``, ``@``, a tab, a CR/LF, or their full-width forms) also gets
the ``quotePrefix`` cell flag: Excel and LibreOffice show it as text and keep it text when the
cell is edited. The value itself is unchanged (searching and filtering still find ``=foo``).
Characters XML cannot hold are removed and cells are cut at Excel's 32,767 characters.
"""

from __future__ import annotations

import re

#: first characters that start a formula (or DDE payload) in Excel / LibreOffice / CSV import
FORMULA_TRIGGERS = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20")
#: Excel's limit on the characters of one cell
MAX_CELL_CHARS = 32_767
#: Excel's limit on a string literal inside a formula
MAX_FORMULA_LITERAL = 255
# the same set as openpyxl.cell.cell.ILLEGAL_CHARACTERS_RE (imported lazily there)
_ILLEGAL = re.compile(r"[\000-\010]|[\013-\014]|[\016-\037]")


def is_formula_like(text: str) -> bool:
    """Whether a spreadsheet could read ``text`` as a formula (see the module docstring)."""
    return text[:1] in FORMULA_TRIGGERS


def cell_text(text: str) -> str:
    """``text`` as a cell can hold it: illegal XML characters removed, cut at Excel's limit."""
    return _ILLEGAL.sub("", text)[:MAX_CELL_CHARS]


def hyperlink_formula(target: str, label: str) -> str:
    """``=HYPERLINK("target","label")`` with ``label`` (untrusted) as a safe string literal: quotes
    doubled, illegal characters removed, cut to Excel's 255 characters per literal."""
    safe = cell_text(label).replace("\n", " ").replace("\r", " ")[:MAX_FORMULA_LITERAL].replace('"', '""')
    return f'=HYPERLINK("{target}","{safe}")'
