"""Untrusted text in the workbook: op, module and file names come from the dumped model.

The rule (docs/reports.md): every text cell is written as a *string* cell, never a formula, and a
string that a spreadsheet could take for a formula when it is edited, re-typed or pasted as CSV
(first character ``=``, ``+``, ``-``, ``@``, a tab, a CR/LF, or their full-width forms) also gets
the ``quotePrefix`` cell flag: Excel and LibreOffice show it as text and keep it text when the
cell is edited. The value itself is unchanged (searching and filtering still find ``=foo``). The rule
lives in :mod:`torchparity.plugin_types` so that every writer of spreadsheets shares it.
Characters XML cannot hold are removed and cells are cut at Excel's 32,767 characters.
"""

from __future__ import annotations

from torchparity.plugin_types import FORMULA_TRIGGERS, MAX_CELL_CHARS, cell_text, is_formula_like

__all__ = ["FORMULA_TRIGGERS", "MAX_CELL_CHARS", "cell_text", "hyperlink_formula", "is_formula_like"]

#: Excel's limit on a string literal inside a formula
MAX_FORMULA_LITERAL = 255


def hyperlink_formula(target: str, label: str) -> str:
    """``=HYPERLINK("target","label")`` with ``label`` (untrusted) as a safe string literal: quotes
    doubled, illegal characters removed, cut to Excel's 255 characters per literal."""
    safe = cell_text(label).replace("\n", " ").replace("\r", " ")[:MAX_FORMULA_LITERAL].replace('"', '""')
    return f'=HYPERLINK("{target}","{safe}")'
