"""``DumpUnit``: one (step, rank) directory of a dump. Its own module so that every reader
(torchparity's, msprobe's) names it without importing the other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DumpUnit:
    """One (step, rank) directory of a dump."""

    step: int
    rank: int
    path: Path
    format: str  # torchparity | msprobe
