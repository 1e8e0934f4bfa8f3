"""The job compare (``compare --distributed``, torchrun/srun): first diverging (step, rank, op), the
per-rank table, every gap reported as not compared, the same verdict as the single-process compare."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import torchparity
from torchparity.compare._testing import run_cli
from torchparity.compare.distributed import compare_job, first_host, launcher_env

ROOT = Path(__file__).resolve().parents[2]
PLANT = dict(rank=2, step=1)


def _synth() -> object:
    spec = importlib.util.spec_from_file_location("_tp_synth_job", ROOT / "bench" / "synth_job.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _job(out: Path, *extra: str, ranks: int = 4) -> tuple[Path, Path]:
    assert _synth().main([str(out), "--ranks", str(ranks), "--records", "400", "--steps", "2", "--plant-rank",
                          str(PLANT["rank"]), "--plant-step", str(PLANT["step"]), "-j", "1", *extra]) == 0
    return out / "dev", out / "bench"


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _job(tmp_path_factory.mktemp("planted"))


@pytest.fixture()
def clean(tmp_path: Path) -> tuple[Path, Path]:
    return _job(tmp_path / "clean", "--no-plant")


def _check_planted(s: dict) -> None:
    fd = s["first_divergence"]
    assert (fd["step"], fd["rank"], fd["op"], fd["module"]) == (1, 2, "aten.silu.default", "model.layers.2.mlp.act_fn")
    table = {r["rank"]: r for r in s["per_rank"]}
    assert [table[r]["verdict"] for r in range(4)] == ["agree", "agree", "diverged", "agree"]
    assert table[2]["first_divergence"]["name"] == fd["name"]
    assert all(r["steps_compared"] == [0, 1] and r["records_compared"] == 400 for r in table.values())
    assert s["n_shards"] == s["n_shards_compared"] == 8 and s["n_shards_not_compared"] == 0


def test_two_pool_workers_same_answer(planted: tuple[Path, Path]) -> None:
    job = compare_job(*planted, workers=2, launcher=False)
    _check_planted(job.summary)
    assert len({w["worker"] for w in job.summary["workers"]}) == 2  # both pool workers compared shards


def test_one_worker_names_the_first_divergence(planted: tuple[Path, Path], tmp_path: Path) -> None:
    job = compare_job(*planted, tmp_path / "out", workers=1, launcher=False)
    _check_planted(job.summary)
    assert job.exit_code == 1
    report = (tmp_path / "out" / "job_report.md").read_text()
    assert "| 2 | 0, 1 | 400 | step 1 aten.silu.default" in report
    assert (tmp_path / "out" / "first_divergence" / "compare.json").is_file()


def test_same_verdict_as_single_process_compare(planted: tuple[Path, Path]) -> None:
    one = torchparity.compare(*planted, workers=1)
    job = compare_job(*planted, workers=1, launcher=False).summary
    rc = one.root_cause
    assert (rc.step, rc.rank, rc.name, rc.op) == tuple(job["first_divergence"][k] for k in ("step", "rank", "name", "op"))
    for k in ("n_compared", "n_pass", "n_warning", "n_error"):
        assert job[k] == one.summary[k], k


def test_clean_job_agrees_exit_0(clean: tuple[Path, Path]) -> None:
    code, out = run_cli(["compare", str(clean[0]), str(clean[1]), "--distributed", "-j", "1"])
    assert code == 0, out
    assert "no divergence: every shard agrees" in out and "0 NOT compared" in out


def _gap_cli(dev: Path, bench: Path) -> tuple[int, str]:
    code, out = run_cli(["compare", str(dev), str(bench), "--distributed", "-j", "1"])
    assert "Traceback" not in out
    return code, out


def test_rank_missing_on_one_side(clean: tuple[Path, Path]) -> None:
    for s in (0, 1):
        shutil.rmtree(clean[1] / f"step{s}" / "rank3")
    code, out = _gap_cli(*clean)
    assert code == 2  # nothing diverged, but rank 3 was not compared: not "the runs agree"
    assert "compared 6 of 8 (step, rank) shards" in out and "2 NOT compared" in out
    assert "torchparity: warning: rank 3 is missing from the bench dump (device has it at steps 0, 1); not compared" in out
    assert "| 3 | - (not compared: 0, 1) | 0 | - | not compared |" in out


def test_step_missing_on_one_side(clean: tuple[Path, Path]) -> None:
    shutil.rmtree(clean[0] / "step1")
    code, out = _gap_cli(*clean)
    assert code == 2
    assert "step 1 is missing from the device dump (bench has it for ranks 0-3); not compared" in out
    assert "compared 4 of 8" in out


def test_different_world_sizes(tmp_path: Path) -> None:
    dev, _ = _job(tmp_path / "a", "--no-plant")
    _, bench = _job(tmp_path / "b", "--no-plant", ranks=3)
    code, out = _gap_cli(dev, bench)
    assert code == 2
    assert "the runs have different world sizes: device 4 (ranks 0-3), bench 3 (ranks 0-2); compared the ranks both have" in out
    assert "rank 3 is missing from the bench dump" in out


def test_corrupt_shard_is_not_compared_and_the_rest_is(planted: tuple[Path, Path], tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    shutil.copytree(planted[0], dev)
    f = dev / "step0" / "rank1" / "records.jsonl"
    lines = f.read_bytes().split(b"\n")
    lines[5] = b'{"id": 5, "name": '  # a corrupt line in the middle
    f.write_bytes(b"\n".join(lines))
    job = compare_job(dev, planted[1], workers=1, launcher=False)
    s = job.summary
    assert s["first_divergence"]["rank"] == 2  # the rest was compared
    bad = [r for r in job.shards if (r.step, r.rank) == (0, 1)][0]
    assert bad.status == "not compared" and "step0/rank1/records.jsonl" in bad.reason
    assert s["n_shards_not_compared"] == 1 and not s["complete"]
    assert {r["rank"]: r["verdict"] for r in s["per_rank"]}[1] == "incomplete"
    assert any("step0/rank1" in m and "--allow-partial" in m for m in s["not_compared"])


def test_corrupt_shard_on_a_clean_job_exits_2(clean: tuple[Path, Path]) -> None:
    f = clean[0] / "step1" / "rank0" / "records.jsonl"
    f.write_bytes(f.read_bytes()[:-300])  # truncated: a killed writer
    code, out = _gap_cli(*clean)
    assert code == 2 and "1 of 8 shard(s) NOT compared" in out


def test_srun_environment() -> None:
    assert first_host("node[07-09,12],gpu3") == "node07"
    assert first_host("gpu3,gpu4") == "gpu3"
    env = launcher_env({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_NODELIST": "n[4-7]",
                        "SLURM_JOB_ID": "12345"})
    assert env == {"rank": 3, "world_size": 16, "master_addr": "n4", "master_port": 29845, "launcher": "srun"}
    # a batch script (no srun step) and a single process are no launcher: a local compare
    assert launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}) is None
    assert launcher_env({"RANK": "0", "WORLD_SIZE": "1"}) is None


def _gloo() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_gloo_available()
    except Exception:
        return False


def _torchrun_compare(planted: tuple[Path, Path], out_dir: Path) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 -m torchparity compare ... --json`` on a fresh port, in its own
    process group (on a timeout the workers go with the launcher: no orphan left waiting)."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                             "127.0.0.1", "--master-port", str(port), "-m", "torchparity", "compare", str(planted[0]),
                             str(planted[1]), "-o", str(out_dir), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun compare did not finish in 240 s; its output:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.skipif(not _gloo(), reason="torch.distributed with gloo is not available")
def test_torchrun_two_workers(planted: tuple[Path, Path], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    p = _torchrun_compare(planted, out_dir)
    if "{" not in p.stdout:
        # a launch that never produced a summary (seen once in ~20 runs on the loaded 2-core VM: the
        # free port picked above taken before torchrun bound it) is retried once on a new port,
        # and its output kept in the failure message should the retry fail too
        first = p.stderr[-3000:]
        warnings.warn(f"torchrun compare gave no summary (exit {p.returncode}); retrying once:\n{first}")
        out_dir = tmp_path / "out2"
        p = _torchrun_compare(planted, out_dir)
        assert "{" in p.stdout, (f"no JSON summary twice (exit {p.returncode}); first stderr:\n{first}\n"
                                 f"second stderr:\n{p.stderr[-3000:]}")
    import json

    out = p.stdout
    s = json.loads(out[out.index("{"):out.rindex("}") + 1])["summary"]
    _check_planted(s)
    assert s["launcher"] == {"name": "torchrun", "world_size": 2}
    assert len(s["workers"]) == 2 and sum(w["shards"] for w in s["workers"]) == 8
    assert p.returncode != 0  # the divergence's exit code 1 reaches the launcher
    assert (out_dir / "job_report.md").is_file()


def test_one_process_launcher_still_gives_the_job_report(planted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    code, out = run_cli(["compare", str(planted[0]), str(planted[1]), "-j", "1"])
    assert code == 1 and "first divergence: step 1 rank 2 op aten.silu.default" in out
