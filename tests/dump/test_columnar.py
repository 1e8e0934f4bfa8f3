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
    with torchparity.dump(str(path), level="mix", mode="statistics", model=model, summaries="step"):
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
    u = open_dump(dumped).unit(0, 0)
    root = tmp_path / "r"
    real_open = open

    class _HalfWay:  # a killed / full-disk write: half the bytes land, then the error
        def __init__(self, path, mode="r", *a, **kw):
            self.f = real_open(path, mode, *a, **kw)

        def write(self, data):
            self.f.write(bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def opens(path, mode="r", *a, **kw):
        return _HalfWay(path, mode, *a, **kw) if "w" in mode else real_open(path, mode, *a, **kw)

    monkeypatch.setattr(columnar, "open", opens, raising=False)
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


# ---- the live summaries (dump/summary_live.py): built by the writer from the records it writes ----


class _Net(torch.nn.Module):
    """Two modules, scalar arguments, NaN and -Inf values, an unmeasured (uninitialised) input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x) * 2.0
        bad = torch.log(h.detach().clamp(max=0.5) - 0.4)  # NaN (log of negatives) and -Inf
        h = h + bad.nan_to_num(0.0, 0.0, 0.0) * 0
        h = torch.clamp(h, min=-3.0)
        buf = torch.empty_like(h)
        buf.copy_(h)  # copy_ overwrites uninitialised memory: described, not measured
        return self.b(buf).sum(dim=-1, keepdim=True) + x.shape[0]


def _run_net(path: Path, level: str, mode: str, **kw) -> Path:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    with torchparity.dump(str(path), level=level, mode=mode, model=model, **{"summaries": "step", **kw}):
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return path


def _same_table(a, b) -> None:
    """Equal schema, metadata and values (NaN equal to NaN, null apart from NaN, -0.0 apart from 0.0)."""
    assert a.schema.equals(b.schema, check_metadata=True), (a.schema, b.schema)
    assert a.num_rows == b.num_rows

    def key(v):
        return ("nan",) if isinstance(v, float) and math.isnan(v) else (type(v).__name__, repr(v))

    for c in a.column_names:
        assert [key(v) for v in a.column(c).to_pylist()] == [key(v) for v in b.column(c).to_pylist()], c


def _tables(root: Path) -> dict[str, object]:
    import pyarrow.parquet as pq

    return {str(p.relative_to(root)): pq.read_table(p) for p in sorted((root / "summary").rglob("part.parquet"))}


def _assert_live_equals_compact(root: Path, tmp_path: Path) -> None:
    import shutil

    again = tmp_path / (root.name + "-compacted")
    shutil.copytree(root, again)
    shutil.rmtree(again / "summary")
    rep = compact(again, force=True)
    assert rep.failed == [] and rep.written
    live, made = _tables(root), _tables(again)
    assert sorted(live) == sorted(made) and len(live) == 3 * len(rep.written)
    for name in live:
        _same_table(live[name], made[name])


@pytest.mark.parametrize("level,mode,kw", [
    ("mix", "statistics", {}),
    ("aten", "md5", {"exclude_ops": ["aten.t*"]}),  # records filtered out
    ("aten", "tensor", {"max_bytes": 600}),  # tensors dropped past the budget: entries lose their file
    ("api", "statistics", {"ops": ["*linear*", "*log*", "*clamp*"]}),
])
def test_live_summaries_equal_what_compact_makes_from_the_file(tmp_path: Path, monkeypatch, level, mode, kw) -> None:
    read_back: list[object] = []
    monkeypatch.setattr(columnar, "footer_fields", lambda *a, **k: read_back.append(a) or {"summary": False})
    root = _run_net(tmp_path / f"{level}-{mode}", level, mode, **kw)
    assert read_back == []  # every summary came from the writer's own columns, none from re-reading the file
    text = (root / "step0/rank0/records.jsonl").read_text()
    if level != "api":  # (the api case filters them out)
        assert '"NaN"' in text and '"kind":"scalar"' in text and "unmeasured" in text  # the cases are really there
    monkeypatch.undo()
    _assert_live_equals_compact(root, tmp_path)


def _odd_records(step: int) -> list:
    """Records whose values do not read back as they were (tuples, NaN scalars, -0.0, a missing
    statistic, a bad op name the reader drops, module None): the live columns must read them as the
    reader reads the file."""
    from torchparity.records import OpRecord, TensorEntry

    st = {"max": 1.0, "min": -0.0, "mean": float("nan"), "norm": float("inf"), "nan": 1, "inf": 2}

    def t(**k):
        return TensorEntry(**{"io": "input", "arg": "0", "dtype": "float32", "shape": torch.Size([2, 3]),
                              "stride": (3, 1), "device": "cpu", "requires_grad": False, **k})

    recs = [
        OpRecord(0, "Aten.mul.0.forward", "aten.mul.Tensor", "aten", "forward", "m", 0, step, 0,
                 tensors=[t(stats=dict(st)), TensorEntry("input", "1", "scalar", value=float("nan")),
                          TensorEntry("input", "alpha", "scalar", value=(1, -0.0)),
                          TensorEntry("output", "0", "none"), t(io="output", stats=None)],
                 flags={"inplace": True, "shape": (2, 3), "x": float("nan")}),
        OpRecord(1, "Aten.bad.0.forward", "bad op?", "aten", "forward", "m", 0, step, 0,  # the reader drops it
                 tensors=[t(stats=dict(st))]),
        OpRecord(2, "Aten.add.0.forward", "aten.add.Tensor", "aten", "forward", None, 0, step, 0,  # module None
                 tensors=[t(stats={"max": 1.0, "min": 0.0}), t(arg="1", stats=dict(st), md5="ab")],
                 flags={"compute_dtype": "bfloat16", "collective": True}),
        OpRecord(3, "Module.m.Lin.forward.0", "Lin", "module", "forward", "m", 0, step, 0, module_class="Lin",
                 tensors=[t(stats=dict(st, max=-0.0), file="tensors/x.safetensors", key="k", producer=(0, 1))],
                 flags={}),
    ]
    return recs


def _write_odd(root: Path, when: str, steps: int = 2):
    from torchparity.capture.batch import Batch
    from torchparity.dump.writer import DumpWriter

    w = DumpWriter(root, {"tool_version": "test"}, fsync=False, summaries=when)
    w.add_modules([("m", "Lin", ""), ("", "Top", None)])
    for step in range(steps):
        w.submit(Batch(step, 0, _odd_records(step), [], None))
        w.end_step(step)
    w.flush()
    return w


def test_live_columns_read_odd_values_as_the_reader_reads_the_file(tmp_path: Path, monkeypatch) -> None:
    read_back: list[object] = []
    monkeypatch.setattr(columnar, "footer_fields", lambda *a, **k: read_back.append(a) or {"summary": False})
    root = tmp_path / "odd"
    _write_odd(root, "step").close()
    assert read_back == []
    monkeypatch.undo()
    _assert_live_equals_compact(root, tmp_path)
    import pyarrow.parquet as pq

    ops = pq.read_table(columnar.part_path(root, "ops", 0, 0)).to_pylist()
    assert [o["record_id"] for o in ops] == [0, 3]  # the two damaged records left out, as the reader does
    meta = columnar.read_meta(columnar.part_path(root, "ops", 0, 0))
    assert "2 record(s) with wrong values skipped" in meta["frame_warnings"][0][0]
    ten = pq.read_table(columnar.part_path(root, "tensors", 0, 0)).to_pylist()
    assert [t["value"] for t in ten[:4]] == [None, None, "[1, -0.0]", None]  # NaN is written as null


def test_summaries_option_step_close_off(tmp_path: Path) -> None:
    parts = lambda root: sorted(str(p.relative_to(root / "summary")) for p in (root / "summary").rglob("part.parquet")) \
        if (root / "summary").is_dir() else []  # noqa: E731
    footer = lambda root, s: json.loads((root / f"step{s}/rank0/footer.json").read_text())  # noqa: E731
    w = _write_odd(tmp_path / "step", "step")  # written when each step ends, before the close
    assert len(parts(tmp_path / "step")) == 6 and footer(tmp_path / "step", 0)["summary"] is True
    w.close()
    w = _write_odd(tmp_path / "close", "close")  # kept until the dump closes
    assert parts(tmp_path / "close") == [] and footer(tmp_path / "close", 1)["summary"] is False
    assert "when the dump closes" in footer(tmp_path / "close", 1)["summary_error"]
    w.close()
    assert parts(tmp_path / "close") == parts(tmp_path / "step")
    assert footer(tmp_path / "close", 1)["summary"] is True and "summary_error" not in footer(tmp_path / "close", 1)
    for name in _tables(tmp_path / "step"):
        _same_table(_tables(tmp_path / "step")[name], _tables(tmp_path / "close")[name])
    _write_odd(tmp_path / "off", "off").close()  # never: torchparity compact writes them later
    assert parts(tmp_path / "off") == [] and "compact" in footer(tmp_path / "off", 0)["summary_error"]
    assert sorted(compact(tmp_path / "off").written) == ["step0/rank0", "step1/rank0"]
    assert parts(tmp_path / "off") == parts(tmp_path / "step")


def test_summaries_option_is_validated_and_read_from_config_files(tmp_path: Path) -> None:
    from torchparity.capture.options import DumpOptions, load_options_file
    from torchparity.errors import UsageError

    assert DumpOptions().summaries == "off"  # no Parquet work while training unless asked
    with pytest.raises(UsageError, match="summaries must be step, close or off"):
        DumpOptions(summaries="never")
    cfg = tmp_path / "dump.yaml"
    cfg.write_text("dump:\n  summaries: off_typo\n")
    with pytest.raises(UsageError, match="summaries"):
        DumpOptions(**load_options_file(cfg))
    cfg.write_text("dump:\n  summaries: close\n")
    assert DumpOptions(**load_options_file(cfg)).summaries == "close"


def test_live_fingerprint_is_the_files_and_detects_an_edit(tmp_path: Path) -> None:
    from torchparity.capture.batch import Batch
    from torchparity.dump.writer import DumpWriter

    root = tmp_path / "big"
    w = DumpWriter(root, {"tool_version": "test"}, fsync=False, summaries="step")
    for i in range(120):  # ~240 KiB in 120 batches: the head and the tail are both partial batches
        w.submit(Batch(0, 0, [r for r in _odd_records(0) if r.op != "bad op?"] * 3, [], None))
    w.end_step(0)
    w.close()
    rec = root / "step0/rank0/records.jsonl"
    assert rec.stat().st_size > 3 * columnar.FP_BYTES
    meta = columnar.read_meta(columnar.part_path(root, "tensors", 0, 0))
    assert meta["records_jsonl"] == columnar.fingerprint(rec)  # what the writer kept equals the file's
    u = open_dump(root).unit(0, 0)
    assert columnar.summary_state(u) == ("ok", None)
    data = bytearray(rec.read_bytes())
    at = len(data) - 200  # an edit of the same size near the end
    data[at:at + 3] = b"9.5" if data[at:at + 3] != b"9.5" else b"8.5"
    rec.write_bytes(bytes(data))
    state, why = columnar.summary_state(u)
    assert state == "bad" and "stale" in why
    w2: list[str] = []
    assert columnar.read_compare_frame(u, w2) is None and "stale" in w2[0]
