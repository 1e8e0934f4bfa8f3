"""Fixtures of the dump tests: a two-process gloo job."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from torchparity.compare._testing import gloo_job


@pytest.fixture
def gloo_pair(tmp_path: Path) -> Callable[..., tuple[list[int], list[str], Path]]:
    """``gloo_pair(script, args_of, ok)`` runs ``script`` as rank 0 and rank 1 (``args_of(rank,
    work)`` gives each one's arguments, ``work`` a fresh folder for the dump and the rendezvous
    file); returns ``(return codes, stderrs, work)``. A run that ``ok(codes, errs)`` rejects while a
    rank's stderr shows gloo's own transport failure is run once more in a new folder."""

    def run(script: Path, args_of: Callable[[int, Path], list[str]],
            ok: Callable[[list[int], list[str]], bool]) -> tuple[list[int], list[str], Path]:
        def new_dir(name: str) -> Path:
            (tmp_path / name).mkdir()
            return tmp_path / name

        return gloo_job(script, 2, new_dir, args_of, ok)

    return run
