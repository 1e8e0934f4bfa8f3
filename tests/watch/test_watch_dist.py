"""torchparity.watch on 2 gloo ranks: a NaN on rank 1 makes both ranks replay together, and each
rank's report names its rank (rank 1: the culprit op; rank 0: replayed for its peer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

JOB = Path(__file__).with_name("dist_job.py")


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_ranks_replay_together_and_the_report_names_the_rank(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(JOB), str(r), "2", str(tmp_path / "init"), str(tmp_path / "w")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the 2-rank watch job hung (a rank replayed alone?)")
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
    w = tmp_path / "w"
    # rank 1 goes on with its NaN (on_trigger="continue": the run as unwatched); later triggers are
    # logged, not replayed (max_triggers=1), and rank 0 sees them as its peer's
    assert json.loads((w / "result.rank0.json").read_text()) == ["peer"] * 3
    assert json.loads((w / "result.rank1.json").read_text()) == ["nonfinite_loss"] * 3
    r1 = json.loads((w / "watch-report.rank1.json").read_text())
    r0 = json.loads((w / "watch-report.json").read_text())
    assert (r1["rank"], r1["world_size"], r1["step"], r1["reproducible"]) == (1, 2, 3, True)
    assert (r1["root_cause"]["module"], r1["root_cause"]["op"]) == ("guard", "aten.sqrt.default")
    assert (r0["rank"], r0["step"], r0["trigger"]["kind"], r0["reproducible"]) == (0, 3, "peer", True)
    assert r0["replay_consistent"] and r1["replay_consistent"]
