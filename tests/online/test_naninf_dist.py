"""The NaN/Inf tracker on a real 2-rank gloo DDP job (tests/online/naninf_dist_job.py): the rank
that made the NaN names its op; the other rank, which got it through DDP's asynchronous bucket
all-reduce, says it read a NaN no op of its own made. Found in session 18: on the host path the
all-reduce's outputs were screened as it returned, before the reduction landed, so rank 0 blamed
its optimizer's ``add_`` ("produced NaN from finite inputs")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchparity.compare._testing import gloo_job

JOB = Path(__file__).with_name("naninf_dist_job.py")
WORLD = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build")
    codes, errs, work = gloo_job(JOB, WORLD, tmp_path_factory.mktemp)
    assert codes == [0] * WORLD, "\n".join(f"--- rank {i} (exit {c}) ---\n{e}" for i, (c, e) in enumerate(zip(codes, errs)))
    return work


def _findings(job: Path, mode: str, rank: int) -> list[dict]:
    return json.loads((job / f"{mode}_rank{rank}.json").read_text())


@pytest.mark.parametrize("mode", ["host", "device"])
def test_the_rank_that_made_the_nan_names_its_op(job: Path, mode: str) -> None:
    f = _findings(job, mode, 1)
    assert f and (f[0]["kind"], f[0]["step"], f[0]["op"], f[0]["module"]) == ("created", 1, "aten.mul.Tensor", "fc1"), f


@pytest.mark.parametrize("mode", ["host", "device"])
def test_a_nan_from_another_rank_is_entered_not_created(job: Path, mode: str) -> None:
    f = _findings(job, mode, 0)
    assert f and not any(x["kind"] == "created" for x in f), f
    assert (f[0]["kind"], f[0]["step"]) == ("entered", 1), f


def test_light_steps_on_both_ranks(job: Path) -> None:
    r1, r0 = _findings(job, "light", 1), _findings(job, "light", 0)
    assert (r1[0]["kind"], r1[0]["step"], r1[0]["module"]) == ("light", 1, "fc1"), r1
    assert (r0[0]["kind"], r0[0]["step"], r0[0]["phase"]) == ("light", 1, "backward"), r0  # its gradients
