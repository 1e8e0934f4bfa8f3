"""The dump of distributed jobs (gloo, CPU): DDP, FSDP2, a 2-D DeviceMesh (data x tensor
parallel), pipeline-style point-to-point. Each job is a few processes of ``dist_job.py`` run twice,
tool off and on: the losses and parameters must be bitwise equal, each rank has its own shards,
``Distributed.*`` records carry their process group (and peer), ``header.json`` the world layout.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable

import pytest
import torch

from torchparity.compare._testing import gloo_job

JOB = Path(__file__).with_name("dist_job.py")

pytestmark = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available in this build")


def _fully_shard_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return False
    return True


def _mesh_available() -> bool:
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    except ImportError:
        return False
    return True


def _run_job(work: Path, kind: str, world: int, dump: Path | None, fault_rank: int = -1) -> list[dict]:
    """Run ``kind`` on ``world`` gloo processes (once more if gloo's own TCP transport drops a
    connection, see conftest); return each rank's result (losses, parameter bytes)."""
    def new_dir(name: str) -> Path:
        (work / f"{kind}_{'on' if dump else 'off'}_{name}").mkdir(parents=True)
        return work / f"{kind}_{'on' if dump else 'off'}_{name}"

    def args_of(r: int, run: Path) -> list[str]:
        return [kind, str(r), str(world), str(run / "init"), str(run / "res{rank}.json"),
                str(dump) if dump else "-", "aten", str(fault_rank)]

    codes, errs, run = gloo_job(JOB, world, new_dir, args_of, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert codes == [0] * world, "\n".join(f"--- rank {i} (exit {c}) ---\n{e[-3000:]}" for i, (c, e) in
                                           enumerate(zip(codes, errs)))
    return [json.loads((run / f"res{r}.json").read_text()) for r in range(world)]


def _records(dump: Path, step: int, rank: int) -> list[dict]:
    lines = (dump / f"step{step}" / f"rank{rank}" / "records.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def _collectives(dump: Path, step: int, rank: int) -> list[dict]:
    return [r for r in _records(dump, step, rank) if r["name"].startswith("Distributed.")]


def _header(dump: Path, step: int, rank: int) -> dict:
    return json.loads((dump / f"step{step}" / f"rank{rank}" / "header.json").read_text())


def _dump_and_baseline(tmp_path: Path, kind: str, world: int) -> Path:
    """Run the job without and with the dump; assert bitwise equal numerics; return the dump."""
    off = _run_job(tmp_path, kind, world, None)
    dump = tmp_path / "dump"
    on = _run_job(tmp_path, kind, world, dump)
    for r in range(world):
        assert on[r]["losses"] == off[r]["losses"], f"rank {r}: losses changed by the tool"
        assert on[r]["params"] == off[r]["params"], f"rank {r}: parameters changed by the tool"
    for step in (0, 1):  # one shard per step and rank, each holding only its rank's records
        for r in range(world):
            recs = _records(dump, step, r)
            assert recs and all(x["rank"] == r and x["step"] == step for x in recs)
    return dump


def _check_world(dump: Path, world: int, groups: Callable[[int], list[list[int]]] | None = None) -> None:
    """Each rank's header (of the last step) holds the layout: size, rank, backend, node, and the
    groups the rank belongs to (``groups(rank)``: their global ranks) besides the default one."""
    for r in range(world):
        w = _header(dump, 1, r)["world"]
        assert (w["world_size"], w["rank"], w["backend"], w["initialized"]) == (world, r, "gloo", True)
        assert w["node"]
        seen = {tuple(g["ranks"]) for g in w["groups"].values()}
        assert all(r in g["ranks"] and name for name, g in w["groups"].items())  # its own groups only
        assert tuple(range(world)) in seen  # the default group
        for ranks in groups(r) if groups else []:
            assert tuple(ranks) in seen, (ranks, w["groups"])


#: where torch cannot read a c10d op's ProcessGroup argument back (no ``ProcessGroup.unbox``: torch 2.1),
#: collectives carry no group/peer flags (docs/distributed.md, "not supported")
_UNBOX = hasattr(torch.distributed.ProcessGroup, "unbox") if torch.distributed.is_available() else False


def test_ddp_dump_is_per_rank_with_groups_and_numerics_unchanged(tmp_path: Path) -> None:
    dump = _dump_and_baseline(tmp_path, "ddp", 2)
    for r in (0, 1):
        coll = _collectives(dump, 0, r)
        assert {c["op"] for c in coll} >= {"c10d.allreduce_.default", "c10d.broadcast_.default"}
        if not _UNBOX:
            assert not any("group" in c["flags"] for c in coll)
            continue
        for c in coll:
            assert c["flags"]["group"] == {"name": "0", "ranks": [0, 1], "size": 2}
        assert all(c["flags"]["root"] == 0 for c in coll if "broadcast" in c["op"])
    _check_world(dump, 2)


@pytest.mark.skipif(not _fully_shard_available(), reason="FSDP2 (fully_shard) needs torch >= 2.4")
def test_fsdp2_dump_measures_local_shards(tmp_path: Path) -> None:
    # before: measuring a DTensor gradient (Partial placement) raised inside the tool
    dump = _dump_and_baseline(tmp_path, "fsdp2", 2)
    for r in (0, 1):
        ops = {c["op"] for c in _collectives(dump, 0, r)}
        assert {"c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default"} <= ops
        # the optimizer updates the rank's shard: 16x8 weight split in two along dim 0
        shapes = [t["shape"] for x in _records(dump, 0, r) if x["phase"] == "optimizer" for t in x["tensors"]
                  if t["kind"] == "tensor"]
        assert [8, 8] in shapes and [16, 8] not in shapes


@pytest.mark.skipif(not _mesh_available(), reason="DeviceMesh (init_device_mesh) needs torch >= 2.2")
def test_2d_mesh_collectives_name_their_group_and_dimension(tmp_path: Path) -> None:
    dump = _dump_and_baseline(tmp_path, "mesh", 4)
    named = hasattr(torch.distributed.ProcessGroup, "group_desc")  # DeviceMesh names its groups (torch >= 2.4)
    for r in range(4):
        tp, dp = [r - r % 2, r - r % 2 + 1], [r % 2, r % 2 + 2]
        coll = _collectives(dump, 0, r)
        groups = [c["flags"]["group"]["ranks"] for c in coll]
        assert groups == [tp] + [dp] * 4  # the row-parallel all-reduce, then the 4 gradient averages
        if named:
            assert [c["flags"]["group"]["mesh_dim"] for c in coll] == ["tp"] + ["dp"] * 4
            assert _header(dump, 0, r)["world"]["mesh_dims"] == {"dp": 2, "tp": 2}
        # an all-reduce's result is not measured when the op returns (the transfer is asynchronous):
        # its consumer (the division by the DP size) measures it: the reduced gradient, not this
        # rank's contribution (before: the contribution's statistics were reused, stale)
        recs = _records(dump, 0, r)
        first_dp = coll[1]
        assert "asynchronous collective" in first_dp["flags"]["unmeasured"]["output.0"]
        div = next(x for x in recs if x["name"] == "Aten.div_.0.forward")
        contribution = first_dp["tensors"][0]["stats"]["norm"]
        assert div["tensors"][0]["stats"]["norm"] != contribution
    _check_world(dump, 4, lambda r: [[r - r % 2, r - r % 2 + 1], [r % 2, r % 2 + 2]])


def test_p2p_records_name_the_peer_and_direction(tmp_path: Path) -> None:
    dump = _dump_and_baseline(tmp_path, "p2p", 2)
    for r, peer in ((0, 1), (1, 0)):
        coll = _collectives(dump, 0, r)
        if not _UNBOX:
            assert len(coll) == 3 and not any("peer" in c["flags"] for c in coll)
            continue
        dirs = [(c["op"].split(".")[1], c["flags"]["direction"], c["flags"]["peer"]) for c in coll]
        if r == 0:  # activation out, gradient in, loss in (batch_isend_irecv)
            assert dirs == [("send", "send", 1), ("recv_", "recv", 1), ("recv_", "recv", 1)]
        else:
            assert dirs == [("recv_", "recv", 0), ("send", "send", 0), ("send", "send", 0)]
    _check_world(dump, 2)


def test_compare_of_two_ddp_runs_names_the_faulty_rank(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    _run_job(tmp_path, "ddp", 2, good)
    _run_job(tmp_path / "f", "ddp", 2, bad, fault_rank=1)
    from torchparity import compare

    result = compare(bad, good, workers=1)
    assert result.diverged
    root = result.root_cause
    assert (root.step, root.rank, root.name) == (0, 1, "Aten.mul.0.forward"), root


def test_ranks_write_the_dump_marker_at_once_without_a_race(tmp_path: Path) -> None:
    # before: every rank wrote torchparity.json through the same "torchparity.json.tmp": one rank's
    # rename took the other's file away (ENOENT: "cannot write the dump" at start)
    from torchparity.dump.writer import _atomic_write_json

    errors: list[BaseException] = []

    def write() -> None:
        for i in range(300):
            try:
                _atomic_write_json(tmp_path / "torchparity.json", {"i": i})
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert json.loads((tmp_path / "torchparity.json").read_text())["i"] == 299
