"""load_dump: torchparity and msprobe dumps, lazy tensors, truncated/corrupt/missing parts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import torchparity
from torchparity.compare._testing import mlp_stack_dump
from torchparity.dump.reader import damage
from torchparity.errors import DumpError


@pytest.fixture(scope="module")
def tensor_dump(tmp_path_factory):
    return mlp_stack_dump(tmp_path_factory.mktemp("r") / "d", mode="tensor", layers=2, width=8, batch=2)


def test_columns_and_lazy_tensors(tensor_dump):
    df = torchparity.load_dump(tensor_dump)
    assert df.attrs["format"] == "torchparity" and df.attrs["warnings"] == []
    for c in ("record_id", "name", "op", "phase", "module", "call_index", "io", "arg", "dtype", "shape",
              "max", "min", "mean", "norm", "nan", "inf", "producer", "tensor"):
        assert c in df.columns
    row = df[(df["name"] == "Aten.gelu.0.forward") & (df["io"] == "output")].iloc[0]
    t = row["tensor"].load()
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == row["shape"]
    assert float(t.max()) == pytest.approx(row["max"])
    inp = df[(df["name"] == "Aten.gelu.0.forward") & (df["io"] == "input")].iloc[0]
    producer = df[df["record_id"] == inp["producer"][0]].iloc[0]
    assert producer["name"] == "Aten.add.0.forward"  # data flow: fc1's bias add feeds gelu


def test_step_rank_filters(tmp_path):
    for s in (0, 1):
        mlp_stack_dump(tmp_path, step=s, layers=1, width=4, batch=2)
    assert sorted(torchparity.load_dump(tmp_path)["step"].unique()) == [0, 1]
    assert set(torchparity.load_dump(tmp_path, step=1)["step"]) == {1}
    assert set(torchparity.load_dump(tmp_path / "step1" / "rank0")["step"]) == {1}
    with pytest.raises(DumpError, match="no data for step=5"):
        torchparity.load_dump(tmp_path, step=5)


def test_truncated_last_line_and_missing_footer(tmp_path):
    root = mlp_stack_dump(tmp_path / "d", layers=2, width=4, batch=2)
    rank = root / "step0" / "rank0"
    n = len((rank / "records.jsonl").read_text().splitlines())
    data = (rank / "records.jsonl").read_bytes()
    (rank / "records.jsonl").write_bytes(data[:-30])  # cut inside the last line
    (rank / "footer.json").unlink()
    df = torchparity.load_dump(root)
    assert df["record_id"].nunique() == n - 1
    w = " ".join(df.attrs["warnings"])
    assert f"read {n - 1} records, the last line was truncated" in w
    assert "no footer.json" in w
    assert len(damage(df.attrs["warnings"])) == 2


def test_corrupt_middle_line(tmp_path):
    root = mlp_stack_dump(tmp_path / "d", layers=2, width=4, batch=2)
    p = root / "step0" / "rank0" / "records.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    lines[2] = "not json at all\n"
    p.write_text("".join(lines))
    df = torchparity.load_dump(root)
    assert df["record_id"].nunique() == len(lines) - 1
    assert any("1 corrupt line(s) skipped (line 3)" in w for w in df.attrs["warnings"])
    assert any("footer.json says" in w for w in df.attrs["warnings"])


def test_missing_pieces(tmp_path):
    with pytest.raises(DumpError, match="does not exist"):
        torchparity.load_dump(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match="no dump found"):
        torchparity.load_dump(tmp_path / "empty")
    root = mlp_stack_dump(tmp_path / "d", layers=1, width=4, batch=2, mode="tensor")
    rank = root / "step0" / "rank0"
    (rank / "tensors" / "000000.safetensors").unlink()
    df = torchparity.load_dump(root)
    with pytest.raises(DumpError, match="is missing"):
        df["tensor"].dropna().iloc[0].load()
    (rank / "records.jsonl").unlink()
    df = torchparity.load_dump(root)
    assert len(df) == 0 and any("records.jsonl is missing" in w for w in df.attrs["warnings"])


def test_killed_process_reads_back(tmp_path):
    """kill -9 in the middle of a dump: everything flushed before reads back."""
    out = tmp_path / "killed"
    script = textwrap.dedent(f"""
        import os, signal, torch, torchparity
        from torchparity.toymodels import TinyConfig, make_model, make_batches
        cfg = TinyConfig(vocab=32, dim=16, layers=1, heads=2, hidden=32, seq=4, batch=2)
        m = make_model(0, cfg)
        d = torchparity.dump({str(out)!r}, level="aten", batch_size=16).start()
        x, _ = make_batches(1, cfg=cfg)[0]
        m(x).sum().backward()
        d.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    df = torchparity.load_dump(out)
    assert df["record_id"].nunique() > 20
    assert df["record_id"].max() + 1 == df["record_id"].nunique()  # no hole
    assert any("not closed cleanly" in w for w in df.attrs["warnings"])


def _msprobe_dump(root, truncated=False):
    rank = root / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save(t, rank / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt")
    desc = lambda x, name=None: {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(x.shape),  # noqa: E731
                                 "Max": float(x.max()), "Min": float(x.min()), "Mean": float(x.mean()),
                                 "Norm": float(x.norm()), "requires_grad": False,
                                 **({"data_name": name} if name else {})}
    data = {
        "Functional.linear.0.forward": {"input_args": [desc(t), desc(t)], "input_kwargs": {},
                                        "output": [desc(t, "Functional.linear.0.forward.output.0.pt")]},
        "Module.layers.0.mlp.MLP.forward.0": {"input_args": [desc(t)], "input_kwargs": {}, "output": [desc(t)]},
        "Functional.linear.0.backward": {"input": [desc(t)], "output": [desc(t), {"Max": "NaN", "Min": 0,
                                         "Mean": 0, "Norm": 0, "type": "torch.Tensor", "dtype": "torch.float32",
                                         "shape": [2, 3]}]},
    }
    text = json.dumps({"task": "tensor", "level": "mix", "framework": "pytorch", "dump_data_dir": "x", "data": data})
    if truncated:
        text = text[: text.index('"Functional.linear.0.backward"') + 40]
    (rank / "dump.json").write_text(text)
    (rank / "construct.json").write_text(json.dumps({"Functional.linear.0.forward": "Module.layers.0.mlp.MLP.forward.0",
                                                     "Module.layers.0.mlp.MLP.forward.0": None}))
    (rank / "stack.json").write_text(json.dumps({"0": [["Functional.linear.0.forward"], ["train.py:3 in f"]]}))
    return root


def test_msprobe_dump(tmp_path):
    df = torchparity.load_dump(_msprobe_dump(tmp_path / "ms"))
    assert df.attrs["format"] == "msprobe"
    lin = df[df["name"] == "Functional.linear.0.forward"]
    assert set(lin["op"]) == {"torch.nn.functional.linear"} and set(lin["module"]) == {"layers.0.mlp"}
    out = lin[lin["io"] == "output"].iloc[0]
    assert torch.equal(out["tensor"].load(), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    bw = df[df["name"] == "Functional.linear.0.backward"]
    assert set(bw["phase"]) == {"backward"} and bw["max"].isna().any()
    mod = df[df["name"] == "Module.layers.0.mlp.MLP.forward.0"]
    assert set(mod["level"]) == {"module"} and set(mod["op"]) == {"MLP"}


def test_msprobe_truncated_dump_json(tmp_path):
    df = torchparity.load_dump(_msprobe_dump(tmp_path / "ms", truncated=True))
    assert set(df["name"]) == {"Functional.linear.0.forward", "Module.layers.0.mlp.MLP.forward.0"}
    assert any("truncated or corrupt" in w and "read 2 complete entries" in w for w in df.attrs["warnings"])


def test_msprobe_pt_is_never_unpickled(tmp_path):
    root = _msprobe_dump(tmp_path / "ms")
    evil = root / "step0" / "rank0" / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt"
    torch.save({"not": os.system}, evil)  # a pickle that would reference os.system
    df = torchparity.load_dump(root)
    row = df[(df["name"] == "Functional.linear.0.forward") & (df["io"] == "output")].iloc[0]
    with pytest.raises(DumpError):
        row["tensor"].load()


# ---- the compare frame (read_unit(..., compact=True)): built column by column, chunk by chunk ----

def _edge_case_dump(root, n_plain: int = 0):
    """A rank directory whose records exercise every corner of the flattening."""
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "header.json").write_text(json.dumps({"format": "torchparity", "version": 1, "step": 0, "rank": 0}))
    t = {"io": "input", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [2, 3], "stride": [3, 1],
         "device": "cpu", "requires_grad": True,
         "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 2.0, "nan": 0, "inf": 0}}
    recs = [
        {"id": 0, "name": "A.0", "op": "aten.mm.default", "level": "aten", "phase": "forward", "module": "m",
         "call_index": 0, "fwd": None, "stack": 3, "tensors": [
             t, dict(t, io="output", arg=0, shape=[], producer=[], md5="ab", file="tensors/x.safetensors", key="k"),
             {"io": "input", "arg": "alpha", "kind": "scalar", "value": 0.5}]},
        # no module (-> ""), no call_index (-> 0), NaN/Infinity as strings, stats missing, odd entries
        {"id": 1, "name": "A.1", "op": "aten.add.Tensor", "level": "aten", "phase": "backward", "fwd": 0,
         "tensors": [dict(t, stats={"max": "Infinity", "min": "-Infinity", "mean": "NaN", "norm": None,
                                    "nan": 2, "inf": 1}, producer=[0, 1], requires_grad=None),
                     dict(t, stats=None, shape=None), "not a tensor entry"]},
        {"id": 2, "name": "A.2", "op": "aten.relu.default", "level": "aten", "phase": "forward", "module": None,
         "tensors": {"not": "a list"}},
        {"id": "3", "name": "A.3", "op": "aten.relu.default", "level": "aten", "phase": "forward", "module": "m",
         "call_index": None, "tensors": [dict(t, stats={"max": "oops", "min": [1], "mean": True})]},
    ]
    # values that cannot be dict keys where strings and shapes belong: read as they are
    recs.append({"id": 4, "name": "A.4", "op": ["odd"], "level": "aten", "phase": "forward", "module": "m",
                 "tensors": [dict(t, dtype={"odd": 1}, shape=[[2], 3])]})
    recs += [{"id": 5 + i, "name": f"B.{i}", "op": "aten.neg.default", "level": "aten", "phase": "forward",
              "module": "m.n", "call_index": i, "fwd": None, "stack": None, "tensors": [dict(t, arg=str(i % 3))]}
             for i in range(n_plain)]
    (rank / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (rank / "footer.json").write_text(json.dumps({"complete": True, "records": len(recs)}))
    return root


def _same(a, b) -> bool:
    from torchparity.dump.reader import TensorRef

    if isinstance(a, TensorRef) or isinstance(b, TensorRef):
        return (type(a), getattr(a, "path", None), getattr(a, "key", None)) == \
            (type(b), getattr(b, "path", None), getattr(b, "key", None))
    missing = [x is None or (isinstance(x, float) and x != x) for x in (a, b)]
    if any(missing):  # None or NaN: pandas' str dtype (>= 3) stores a missing text as NaN
        return all(missing)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("n_plain", [0, 450])
def test_compare_frame_has_the_full_frames_values(tmp_path, n_plain):
    """The column-wise compare frame holds exactly what the row-wise full frame holds."""
    import pandas as pd

    from torchparity.dump.reader import COMPARE_COLUMNS, open_dump, read_unit

    root = _edge_case_dump(tmp_path / "d", n_plain)
    unit = open_dump(root).unit(0, 0)
    full = read_unit(unit, [])[COMPARE_COLUMNS]
    w: list[str] = []
    compact = read_unit(unit, w, compact=True)
    assert w == [] and list(compact.columns) == COMPARE_COLUMNS and len(compact) == len(full) == 7 + n_plain
    for c in COMPARE_COLUMNS:
        a_col, b_col = compact[c].tolist(), full[c].tolist()
        if c in ("fwd", "stack"):  # ids: object ints/None here, float64 with NaN from from_records
            a_col, b_col = (pd.to_numeric(pd.Series(x, dtype=object)).tolist() for x in (a_col, b_col))
        for i, (a, b) in enumerate(zip(a_col, b_col)):
            assert _same(a, b), (c, i, a, b)
    assert compact["record_id"].tolist()[:6] == [0, 0, 0, 1, 1, 3]
    assert compact["call_index"].tolist()[:6] == [0, 0, 0, 0, 0, -1]
    assert compact["module"].tolist()[3] == "" and compact["arg"].tolist()[1] == "0"
    assert compact["shape"].tolist()[:2] == [(2, 3), ()] and compact["producer"].tolist()[:4] == [None, None, None, (0, 1)]
    assert compact.loc[3, ["max", "min"]].tolist() == [float("inf"), float("-inf")]
    # text stays plain object columns (pandas >= 3 would infer its slower "str" dtype)
    for c in ("name", "op", "phase", "module", "io", "arg", "kind", "dtype"):
        assert compact[c].dtype == object, c
    assert compact["tensor"].iloc[1].path == unit.path / "tensors" / "x.safetensors"
    assert compact["op"].iloc[6] == ["odd"] and compact["shape"].iloc[6] == ([2], 3)
    if n_plain:  # equal strings and shapes are one shared object (after the chunk with the odd record)
        assert compact["op"].iloc[-1] is compact["op"].iloc[-2] and compact["shape"].iloc[-1] is compact["shape"].iloc[-2]


def test_bad_lines_in_several_chunks(tmp_path):
    """Line numbers and counts stay right when bad lines fall in different parse chunks."""
    from torchparity.dump.reader import CHUNK_LINES, open_dump, read_unit

    root = _edge_case_dump(tmp_path / "d", n_plain=2 * CHUNK_LINES + 50)
    p = root / "step0" / "rank0" / "records.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    n = len(lines)
    bad = [3, CHUNK_LINES + 7, 2 * CHUNK_LINES + 1]  # 1-based line numbers
    for b in bad:
        lines[b - 1] = "{\"id\": broken\n"
    lines.insert(10, "   \n")  # a blank line is skipped silently
    p.write_text("".join(lines)[:-20])  # and the last line is cut
    for compact in (True, False):
        w: list[str] = []
        df = read_unit(open_dump(root).unit(0, 0), w, compact=compact)
        text = " ".join(w)
        shifted = [b if b <= 10 else b + 1 for b in bad]
        assert f"3 corrupt line(s) skipped (line {', '.join(map(str, shifted))})" in text
        assert f"read {n - 4} records, the last line was truncated" in text
        assert df["record_id"].nunique() == n - 4
