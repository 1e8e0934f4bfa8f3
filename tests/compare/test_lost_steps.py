"""A step directory that a dump lost (deleted, not copied) is damage, not "the runs agree".

Found by a new-user check (session 16): after ``rm -rf dump/step0`` compare warned "step0/rank0
exists only in the bench dump; not compared" and exited 0, "the runs agree". Each step's header
now names the step its rank wrote before it (``prev_step``), so a reader tells a lost step from
one that was never dumped (another ``steps=`` choice).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import torchparity
from torchparity.cli import main
from torchparity.compare.shards import NOT_COMPARED, plan_shards
from torchparity.errors import DumpError
from torchparity.toymodels import TinyConfig, make_batches, make_model, train

SMALL = TinyConfig(vocab=64, dim=16, layers=1, heads=2, hidden=32, seq=8, batch=2)


@pytest.fixture(scope="module")
def two_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lost")
    for side in ("a", "b"):
        m = make_model(cfg=SMALL)
        with torchparity.dump(str(root / side), level="module", model=m):
            train(m, make_batches(3, cfg=SMALL))
    return root / "a", root / "b"


def _copy(src: Path, dst: Path, drop: str | None = None) -> Path:
    shutil.copytree(src, dst)
    if drop:
        shutil.rmtree(dst / drop)
    return dst


def test_each_header_names_the_step_written_before(two_dumps: tuple[Path, Path]) -> None:
    a, _ = two_dumps
    prev = [json.loads((a / f"step{s}" / "rank0" / "header.json").read_text()).get("prev_step") for s in range(3)]
    assert prev == [None, 0, 1]


@pytest.mark.parametrize("drop", ["step0", "step1"])
def test_a_lost_step_is_refused_then_incomplete(two_dumps: tuple[Path, Path], tmp_path: Path, drop: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    a, b = two_dumps
    c = _copy(a, tmp_path / "c", drop)
    with pytest.raises(DumpError, match=f"missing {drop}/rank0"):
        torchparity.compare(str(c), str(b))
    res = torchparity.compare(str(c), str(b), allow_partial=True)
    assert not res.complete and not res.diverged
    with pytest.raises(SystemExit) as ex:
        main(["compare", str(c), str(b)])
    assert ex.value.code == 2 and f"missing {drop}/rank0" in capsys.readouterr().err
    # the steps that are there, asked for by name: compared, and they agree
    other = 2 if drop == "step1" else 1
    assert torchparity.compare(str(c), str(b), step=other).complete


def test_a_lost_step_on_both_sides_is_not_compared_by_the_job_planner(two_dumps: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    a, b = two_dumps
    plan = plan_shards(str(_copy(a, tmp_path / "c", "step1")), str(_copy(b, tmp_path / "d", "step1")))
    assert any(x.step == 1 and x.status == NOT_COMPARED for x in plan.missing)
    assert any("step1/rank0 is missing" in m for m in plan.messages)


def test_steps_never_dumped_and_old_dumps_are_not_lost(two_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    """A dump without the last step (a shorter run) and a dump from before ``prev_step`` existed."""
    a, b = two_dumps
    short = _copy(a, tmp_path / "short", "step2")
    assert torchparity.compare(str(short), str(b)).complete
    old = _copy(a, tmp_path / "old", "step0")
    for h in old.glob("step*/rank*/header.json"):
        d = json.loads(h.read_text())
        d.pop("prev_step")
        h.write_text(json.dumps(d))
    assert torchparity.compare(str(old), str(b)).complete
