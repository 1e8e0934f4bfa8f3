"""Columnar summaries (dump/columnar.py, dump/compact.py): written per step and rank by the dump
writer, equal to the JSONL, atomic, and read by the compare only while they are current."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("pyarrow")

import torchparity  # noqa: E402
from torchparity.dump import columnar  # noqa: E402
from torchparity.dump.compact import compact  # noqa: E402
from torchparity.dump.reader import load_dump, open_dump, read_torchparity_unit  # noqa: E402


def _train(path: Path, seed: int = 0, steps: int = 2, scale: float = 1.0) -> Path:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        model[2].weight.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torchparity.dump(str(path), level="mix", mode="statistics", model=model):
        for _ in range(steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("col") / "dev")


def _jsonl_frame(u, warnings):
    """The compare frame read from records.jsonl only (summaries ignored)."""
    orig = columnar.read_compare_frame
    columnar.read_compare_frame = lambda u, w: None
    try:
        return read_torchparity_unit(u, warnings, compact=True)
    finally:
        columnar.read_compare_frame = orig


def _assert_same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    for c in a.columns:
        if c == "tensor":
            key = lambda t: None if t is None else (t.path, t.key)  # noqa: E731
            assert [key(t) for t in a[c]] == [key(t) for t in b[c]]
        else:
            assert a[c].dtype == b[c].dtype, c
            pd.testing.assert_series_equal(a[c], b[c], check_exact=True)


def test_summaries_per_step_and_rank_equal_the_jsonl(dumped: Path) -> None:
    reader = open_dump(dumped)
    assert reader.steps == [0, 1]
    full = load_dump(dumped)
    for u in reader.units:
        footer = json.loads((u.path / "footer.json").read_text())
        assert footer["summary"] is True
        import pyarrow.parquet as pq

        ops = pq.read_table(columnar.part_path(dumped, "ops", u.step, u.rank)).to_pandas()
        ten = pq.read_table(columnar.part_path(dumped, "tensors", u.step, u.rank)).to_pandas()
        mods = pq.read_table(columnar.part_path(dumped, "modules", u.step, u.rank)).to_pandas()
        rows = full[(full["step"] == u.step) & (full["rank"] == u.rank)].reset_index(drop=True)
        assert len(ops) == footer["records"] == rows["record_id"].nunique()
        assert list(ten["name"]) == list(rows["name"]) and list(ten["io"]) == list(rows["io"])
        for c in ("max", "min", "mean", "norm"):
            assert ten[c].fillna(math.nan).tolist() == pytest.approx(rows[c].tolist(), nan_ok=True)
        assert ten["nan"].fillna(0).sum() == rows["nan"].fillna(0).sum()
        assert {"0", "2", ""} <= set(mods["module"])  # the two Linears and the top level
        w_sum: list[str] = []
        w_json: list[str] = []
        _assert_same_frame(columnar.read_compare_frame(u, w_sum), _jsonl_frame(u, w_json))
        assert w_sum == w_json


def test_a_failed_write_leaves_no_half_file_under_the_real_name(dumped: Path, monkeypatch, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    u = open_dump(dumped).unit(0, 0)
    root = tmp_path / "r"

    def dies_half_way(table, where, **kw):  # a killed / full-disk write: half a file, then the error
        Path(where).write_bytes(b"PAR1" + b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", dies_half_way)
    why = columnar.write_unit_summary(root, u)
    assert why is not None and "No space left" in why
    leftovers = [p for p in root.rglob("*") if p.is_file()]
    assert leftovers == []  # no part.parquet, no temporary file


def test_truncated_or_stale_summary_falls_back_to_the_jsonl_with_a_message(dumped: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(dumped, root)
    u = open_dump(root).unit(1, 0)
    part = columnar.part_path(root, "tensors", 1, 0)
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])  # truncated
    w: list[str] = []
    assert columnar.read_compare_frame(u, w) is None
    assert len(w) == 1 and str(part) in w[0] and "records.jsonl instead" in w[0]
    w2: list[str] = []
    frame = read_torchparity_unit(u, w2, compact=True)
    assert w2 == w and len(frame) == len(_jsonl_frame(u, []))  # the JSONL served it, whole
    # stale: records.jsonl changed after the summary was made
    assert compact(root).written == ["step1/rank0"]
    with open(u.path / "records.jsonl", "ab") as f:
        f.write(b"\n")
    w3: list[str] = []
    assert columnar.read_compare_frame(u, w3) is None and "stale" in w3[0]


def test_compact_an_old_dump_idempotent_and_damaged(dumped: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "old"
    shutil.copytree(dumped, root)
    shutil.rmtree(root / "summary")
    (root / "summary/ops/step=9/rank=0").mkdir(parents=True)  # a step the dump no longer holds
    rec = root / "step0/rank0/records.jsonl"
    lines = rec.read_bytes().split(b"\n")
    lines[3] = b'{"id": 3, "name": broken'
    rec.write_bytes(b"\n".join(lines))
    rep = compact(root)
    assert sorted(rep.written) == ["step0/rank0", "step1/rank0"] and rep.failed == []
    assert rep.removed == ["ops/step=9/rank=0"]
    assert len(rep.skipped) == 1 and "corrupt line" in rep.skipped[0] and "line 4" in rep.skipped[0]
    again = compact(root)
    assert again.written == [] and sorted(again.up_to_date) == ["step0/rank0", "step1/rank0"]
    # what could be read is in the summary, and the compare frame says the same as the JSONL
    u = open_dump(root).unit(0, 0)
    w_sum: list[str] = []
    w_json: list[str] = []
    _assert_same_frame(columnar.read_compare_frame(u, w_sum), _jsonl_frame(u, w_json))
    assert w_sum == w_json and any("corrupt line" in w for w in w_sum)


def test_without_pyarrow_the_dump_works_and_the_footer_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(columnar, "missing_pyarrow", lambda: "pyarrow is not importable (ImportError: test)")
    root = _train(tmp_path / "nopa", steps=1)
    footer = json.loads((root / "step0/rank0/footer.json").read_text())
    assert footer["summary"] is False and "pyarrow" in footer["summary_error"] and footer["complete"] is True
    assert not (root / "summary").exists()
    assert len(load_dump(root)) > 0


def test_compare_is_the_same_with_and_without_summaries(dumped: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil

    dev = _train(tmp_path / "dev", scale=1.001)
    plain_dev, plain_bench = tmp_path / "pd", tmp_path / "pb"
    shutil.copytree(dev, plain_dev)
    shutil.copytree(dumped, plain_bench)
    shutil.rmtree(plain_dev / "summary")
    shutil.rmtree(plain_bench / "summary")
    used: list[bool] = []
    orig = columnar.read_compare_frame
    monkeypatch.setattr(columnar, "read_compare_frame", lambda u, w: (lambda r: used.append(r is not None) or r)(orig(u, w)))
    a = torchparity.compare(dev, dumped, workers=1)
    assert used == [True] * 4  # the summaries served both sides of both steps
    b = torchparity.compare(plain_dev, plain_bench, workers=1)
    drop = [c for c in a.rows.columns if c == "tensor" or c.endswith("_tensor")]
    pd.testing.assert_frame_equal(a.rows.drop(columns=drop), b.rows.drop(columns=drop), check_exact=True)
    assert (a.root_cause and a.root_cause.name) == (b.root_cause and b.root_cause.name)
    for k in ("diverged", "first_divergence", "n_pass", "n_error", "n_warning", "n_not_compared", "n_compared"):
        assert a.summary[k] == b.summary[k], k
    assert a.summary["diverged"] and a.summary["n_compared"] > 0  # a real divergence, really compared
