"""The zoo's modules (zoo_models, zoo_cells) import each other by name: put this folder on sys.path."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """The zoo's models are tiny: one intra-op thread is faster than several fighting over a shared
    CPU (the runner sets OMP_NUM_THREADS=1 for the same reason); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
