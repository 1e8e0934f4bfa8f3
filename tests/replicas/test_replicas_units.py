"""Fast checks of the replica pieces: the bitwise hash, the vote, and the offline command's bad
input (hand-written DIR/replicas/ files, no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchparity.cli import main
from torchparity.replicas import ALGORITHM, check_replicas, tensor_hash, vote
from torchparity.replicas import hashing
from torchparity.replicas.hashing import BLOCK


def _h(t: torch.Tensor) -> int:
    return int(tensor_hash(t))


@pytest.fixture(params=["cpu-xxh3", "device-weighted-sum"])
def hash_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both hashes: XXH3 of the bytes (CPU tensors) and the weighted int64 sum (other devices,
    forced here on the CPU by taking XXH3 away)."""
    if request.param == "device-weighted-sum":
        monkeypatch.setattr(hashing, "_xxh3_int", None)
    return request.param


def test_hash_changes_with_one_ulp_anywhere_and_is_bitwise(hash_path: str) -> None:
    x = torch.randn(BLOCK + 1000)  # crosses a weight block: the tail and the block sums both count
    base = _h(x)
    for i in (0, 17, BLOCK - 1, BLOCK, BLOCK + 999):
        y = x.clone()
        y[i] = torch.nextafter(y[i], torch.tensor(float("inf")))
        assert _h(y) != base, i
    assert _h(x.clone()) == base
    assert _h(torch.tensor([0.0])) != _h(torch.tensor([-0.0]))  # bits, not values
    swapped = x.clone()
    swapped[[3, 4]] = x[[4, 3]]
    assert _h(swapped) != base  # positions count
    assert _h(x[:6].view(2, 3)) != _h(x[:6].view(3, 2))  # shape counts
    m = torch.randn(5, 7)
    assert _h(m.t()) == _h(m.t().contiguous())  # layout does not
    for dt in (torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.bool):
        t = (torch.randn(50) > 0) if dt is torch.bool else torch.randn(50).to(dt)
        assert _h(t) == _h(t.clone())


def test_vote_names_the_minority_and_says_no_majority() -> None:
    f = vote(3, "grad", "w", {0: "a", 1: "a", 2: "b", 3: "a"})
    assert (f.ranks, f.majority, f.no_majority) == ([2], [0, 1, 3], False)
    assert "rank 2 differs from the majority (3 of 4 ranks agree)" in f.describe()
    tie = vote(3, "grad", "w", {0: "a", 1: "a", 2: "b", 3: "b"})
    assert tie.no_majority and tie.majority == [] and "no majority" in tie.describe()
    assert vote(3, "grad", "w", {0: "a", 1: "a"}) is None
    assert vote(0, "param", "w", {0: [1.0, float("nan")], 1: [1.0, float("nan")]}) is None  # NaN == NaN here


def _write(root: Path, rank: int, steps: list[int], world: int = 4, grad: str = "aa", name: str = "w") -> None:
    d = root / "replicas"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"rank{rank}.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "rank": rank, "world_size": world, "algorithm": ALGORITHM, "optimizer": 0,
                                "names": [name], "grad": [grad], "param": ["bb"]}) + "\n")


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["replicas", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code), out, err


def test_offline_agreeing_hashes_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in range(4):
        _write(tmp_path, r, [0, 1])
    code, out, _ = _cli([str(tmp_path)], capsys)
    assert code == 0 and "replicas agree" in out and "4 comparisons" in out


def test_offline_different_world_sizes_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, 0, [0])
    _write(tmp_path, 1, [0], world=2)
    code, _, err = _cli([str(tmp_path)], capsys)
    assert code == 2 and "disagree on the world size (rank 0: 4, rank 1: 2)" in err
    assert len(err.strip().splitlines()) == 1


def test_offline_one_rank_or_nothing_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "one", 0, [0], world=1)
    code, _, err = _cli([str(tmp_path / "one")], capsys)
    assert code == 2 and "holds rank 0 only" in err
    torch_dump = tmp_path / "plain"
    import torchparity

    with torchparity.dump(str(torch_dump), level="aten"):  # no module params, no optimizer
        torch.ones(3).mul(2)
    code, _, err = _cli([str(torch_dump)], capsys)
    assert code == 2 and "replica_check=True" in err and "Traceback" not in err
    code, _, err = _cli([str(tmp_path / "absent")], capsys)
    assert code == 2 and "is not a directory" in err


def test_offline_missing_step_is_named_and_a_finding_still_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in range(3):
        _write(tmp_path, r, [0, 1] if r != 1 else [0], world=3)
    code, _, err = _cli([str(tmp_path)], capsys)
    assert code == 2 and "step 1: rank(s) 1 hold no data for it" in err
    _write(tmp_path, 2, [2], world=3, grad="zz")
    for r in (0, 1):
        _write(tmp_path, r, [2], world=3)
    rep = check_replicas(tmp_path)
    assert rep.exit_code == 1 and (rep.first.step, rep.first.ranks) == (2, [2])


def test_offline_damaged_line_is_skipped_and_told(tmp_path: Path) -> None:
    for r in range(3):
        _write(tmp_path, r, [0], world=3)
    with open(tmp_path / "replicas" / "rank2.jsonl", "a") as f:
        f.write('{"step": 1, "ra')  # a killed process
    rep = check_replicas(tmp_path)
    assert rep.exit_code == 0 and any("line 2 is damaged" in n for n in rep.notes)


def test_dump_option_is_validated() -> None:
    import torchparity
    from torchparity.errors import UsageError

    with pytest.raises(UsageError, match="replica_check must be true or false"):
        torchparity.dump("x", replica_check="yes")
