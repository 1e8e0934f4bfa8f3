"""Replica checks on a real 4-rank gloo DDP job (tests/replicas/gloo_job.py, run once per module):
a fault planted on one rank is found online and offline (step, parameter, rank); a clean job
reports nothing; a rank whose optimizer update alone differs is found as a parameter fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from torchparity.cli import main
from torchparity.compare._testing import gloo_job
from torchparity.replicas import check_replicas

JOB = Path(__file__).with_name("gloo_job.py")
WORLD = 4


def _gloo_ok() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _gloo_ok():
        pytest.skip("torch.distributed with gloo is not available in this build")
    codes, errs, work = gloo_job(JOB, WORLD, tmp_path_factory.mktemp)
    assert codes == [0] * WORLD, "\n".join(f"--- rank {i} (exit {c}) ---\n{e}" for i, (c, e) in enumerate(zip(codes, errs)))
    return work


def _online(job: Path, phase: str, rank: int = 0) -> dict:
    return json.loads((job / phase / f"online_rank{rank}.json").read_text())


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["replicas", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code), out, err


def test_clean_job_reports_nothing_online_and_offline(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in range(WORLD):
        online = _online(job, "clean", rank)
        assert online["findings"] == [] and online["steps"] == 3
        assert online["gathers"] == 3  # one all_gather per step
    code, out, _ = _cli([str(job / "clean")], capsys)
    assert code == 0, out
    assert "replicas agree" in out and "4 ranks" in out


def test_planted_gradient_fault_is_found_online(job: Path) -> None:
    for rank in range(WORLD):  # every rank gathered the same hashes and names the same culprit
        first = _online(job, "grad", rank)["findings"][0]
        assert (first["step"], first["kind"], first["name"], first["ranks"]) == (1, "grad", "fc1.weight", [2])
        assert first["majority"] == [0, 1, 3] and not first["no_majority"]
    kinds = {(f["step"], f["kind"], f["name"]) for f in _online(job, "grad")["findings"]}
    assert (0, "grad", "fc1.weight") not in kinds and all(name == "fc1.weight" for _, _, name in kinds)


def test_planted_gradient_fault_is_found_offline(job: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rep = check_replicas(job / "grad")
    assert rep.source == "hash"
    f = rep.first
    assert (f.step, f.kind, f.name, f.ranks) == (1, "grad", "fc1.weight", [2])
    code, out, _ = _cli([str(job / "grad"), "-o", str(tmp_path / "o")], capsys)
    assert code == 1
    assert "first disagreement: step 1, parameter fc1.weight, rank 2" in out
    saved = json.loads((tmp_path / "o" / "replicas.json").read_text())
    assert saved["first"]["ranks"] == [2] and saved["agree"] is False


def test_optimizer_update_fault_is_a_parameter_fault(job: Path) -> None:
    first = _online(job, "param")["findings"][0]
    assert (first["step"], first["kind"], first["name"], first["ranks"]) == (1, "param", "fc2.bias", [3])
    assert not any(f["kind"] == "grad" for f in _online(job, "param")["findings"])  # its gradients agreed
    rep = check_replicas(job / "param")
    assert (rep.first.step, rep.first.kind, rep.first.name, rep.first.ranks) == (1, "param", "fc2.bias", [3])


def test_offline_without_hashes_reads_the_module_records(job: Path, tmp_path: Path) -> None:
    """The same dumps without DIR/replicas/: the parameters the forward used (statistics to the
    last bit) show the planted gradient fault one step later, on the same rank; a clean dump
    agrees (the tool's own hashing and gather were not recorded into the optimizer phase)."""
    for phase in ("clean", "grad"):
        shutil.copytree(job / phase, tmp_path / phase)
        shutil.rmtree(tmp_path / phase / "replicas")
    clean = check_replicas(tmp_path / "clean")
    assert clean.source == "stats" and clean.compared > 0 and clean.findings == [] and clean.exit_code == 0
    rep = check_replicas(tmp_path / "grad")
    assert (rep.first.step, rep.first.kind, rep.first.name, rep.first.ranks) == (2, "param_in", "fc1.weight", [2])
    assert any("parameters_grad records were not compared" in n for n in rep.notes)


def test_a_missing_rank_is_named_and_not_passed(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(job / "clean", tmp_path / "d")
    (tmp_path / "d" / "replicas" / "rank3.jsonl").unlink()
    code, out, err = _cli([str(tmp_path / "d")], capsys)
    assert code == 2
    assert "rank(s) 3 of the 4-rank job are not in" in err
    assert err.count("torchparity: error:") == 1 and "Traceback" not in err
