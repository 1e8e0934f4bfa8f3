"""Fixtures of the dump tests: a two-process gloo job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

#: gloo's TCP transport sometimes loses a connection between two processes of one job on a
#: loaded machine (upstream flakiness: pytorch/pytorch#53270, #57469): both ranks then end with
#: this message and say nothing about torchparity. Such a run is started once more, in a fresh folder.
GLOO_TRANSPORT_FLAKE = "gloo/transport/tcp/pair.cc"


def _run_pair(script: Path, args_of: Callable[[int, Path], list[str]], work: Path) -> tuple[list[int], list[str]]:
    procs = [subprocess.Popen([sys.executable, str(script), *args_of(r, work)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    return [p.returncode for p in procs], errs


@pytest.fixture
def gloo_pair(tmp_path: Path) -> Callable[..., tuple[list[int], list[str], Path]]:
    """``gloo_pair(script, args_of, ok)`` runs ``script`` as rank 0 and rank 1 (``args_of(rank,
    work)`` gives each one's arguments, ``work`` a fresh folder for the dump and the rendezvous
    file); returns ``(return codes, stderrs, work)``. A run that ``ok(codes, errs)`` rejects while a
    rank's stderr shows gloo's own transport failure is run once more in a new folder."""

    def run(script: Path, args_of: Callable[[int, Path], list[str]],
            ok: Callable[[list[int], list[str]], bool]) -> tuple[list[int], list[str], Path]:
        for attempt in range(2):
            work = tmp_path / f"attempt{attempt}"
            work.mkdir()
            codes, errs = _run_pair(script, args_of, work)
            if ok(codes, errs) or not any(GLOO_TRANSPORT_FLAKE in e for e in errs):
                break
        return codes, errs, work

    return run
