"""The text's building blocks: numbers and places in words, and the wrapped plain-text document.

:func:`fmt` writes a number for people; ``_int`` and ``_get`` read a value from a row that may be
missing or NaN; ``_where`` says "step S, rank R, phase"; ``_Doc`` collects headings, paragraphs
and bullets wrapped to a width (indented code lines are never wrapped).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any, Mapping

from torchparity.plugin_types import format_number

#: a number for people: 3 significant digits, NaN/inf spelled out, None as 'n/a' (``fmt(x, spec=".3g")``)
fmt = format_number


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _get(row: Mapping[str, Any], key: str) -> Any:
    v = row.get(key)
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _where(step: Any, rank: Any, phase: Any) -> str:
    bits = []
    if step is not None:
        bits.append(f"step {step}")
    if rank is not None:
        bits.append(f"rank {rank}")
    if phase:
        bits.append(str(phase))
    return ", ".join(bits)


class _Doc:
    def __init__(self, width: int) -> None:
        self.width = max(40, width)
        self.lines: list[str] = []

    def h(self, title: str) -> None:
        if self.lines:
            self.lines.append("")
        self.lines += [title, "-" * len(title)]

    def p(self, text: str, indent: str = "") -> None:
        for para in text.split("\n"):
            if para.startswith("    "):  # code: never wrapped
                self.lines.append(indent + para)
            else:
                self.lines += textwrap.wrap(para, self.width, initial_indent=indent, subsequent_indent=indent,
                                            break_on_hyphens=False, break_long_words=False) or [""]

    def bullet(self, text: str, mark: str = "- ") -> None:
        pad = " " * len(mark)
        first = True
        for para in text.split("\n"):
            if para.startswith("    "):
                self.lines.append(pad + para)
                continue
            wrapped = textwrap.wrap(para, self.width, initial_indent=mark if first else pad, subsequent_indent=pad,
                                    break_on_hyphens=False, break_long_words=False)
            self.lines += wrapped or [""]
            first = False

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"
