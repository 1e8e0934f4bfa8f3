"""``Damage``: a reader warning that means data was lost. Its own module so that every reader
(records columns, footer, msprobe) can mark damage without importing the reader that calls it."""

from __future__ import annotations

from typing import Iterable


class Damage(str):
    """A reader warning that means data was lost (truncated, corrupt or missing parts).

    It is a plain ``str`` for everyone reading ``df.attrs["warnings"]``; :func:`damage` picks
    these out so that ``torchparity compare`` can refuse a damaged dump unless told to compare
    what was read (``--allow-partial``)."""


def damage(warnings: Iterable[str]) -> list[str]:
    """The warnings that report lost data."""
    return [w for w in warnings if isinstance(w, Damage)]
