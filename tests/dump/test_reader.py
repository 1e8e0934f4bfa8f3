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
from torchparity.dump.reader import damage, open_dump, read_unit
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
    with pytest.raises(DumpError) as err:
        row["tensor"].load()
    msg = str(err.value)  # one line (torch.load's refusal runs to 8 lines)
    assert "\n" not in msg and "never unpickles" in msg and evil.name in msg


# ---- the compare frame (read_unit(..., compact=True)): built column by column, chunk by chunk ----

_T = {"io": "input", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [2, 3], "stride": [3, 1],
      "device": "cpu", "requires_grad": True,
      "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 2.0, "nan": 0, "inf": 0}}


def _write_rank(root, recs, footer=True):
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "header.json").write_text(json.dumps({"format": "torchparity", "version": 1, "step": 0, "rank": 0}))
    (rank / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if footer:
        (rank / "footer.json").write_text(json.dumps({"complete": True, "records": len(recs)}))
    return root


def _edge_case_dump(root, n_plain: int = 0):
    """A rank directory whose (valid) records exercise every corner of the flattening."""
    t = _T
    recs = [
        {"id": 0, "name": "Aten.mm.0.forward", "op": "aten.mm.default", "level": "aten", "phase": "forward", "module": "m",
         "call_index": 0, "fwd": None, "stack": 3, "tensors": [
             t, dict(t, io="output", arg="0", shape=[], producer=[], md5="ab", file="tensors/x.safetensors", key="k"),
             {"io": "input", "arg": "alpha", "kind": "scalar", "value": 0.5}]},
        # no module (-> ""), no call_index (-> 0), NaN/Infinity as strings, a tensor without statistics
        {"id": 1, "name": "Aten.add.0.backward", "op": "aten.add.Tensor", "level": "aten", "phase": "backward", "fwd": 0,
         "tensors": [dict(t, stats={"max": "Infinity", "min": "-Infinity", "mean": "NaN", "norm": 1.5,
                                    "nan": 2, "inf": 1}, producer=[0, 0], requires_grad=None),
                     {k: v for k, v in t.items() if k != "stats"}]},
        {"id": 2, "name": "Aten.relu.0.forward", "op": "aten.relu.default", "level": "aten", "phase": "forward", "module": None,
         "tensors": []},
        {"id": 3, "name": "Aten.relu.1.forward", "op": "aten.relu.default", "level": "aten", "phase": "forward", "module": "m",
         "tensors": [{"io": "output", "arg": "0", "kind": "none"}]},
    ]
    recs += [{"id": 4 + i, "name": f"Aten.neg.{i}.forward", "op": "aten.neg.default", "level": "aten", "phase": "forward",
              "module": "m.n", "call_index": i, "fwd": None, "stack": None, "tensors": [dict(t, arg=str(i % 3))]}
             for i in range(n_plain)]
    return _write_rank(root, recs)


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
    assert w == [] and list(compact.columns) == COMPARE_COLUMNS and len(compact) == len(full) == 6 + n_plain
    for c in COMPARE_COLUMNS:
        a_col, b_col = compact[c].tolist(), full[c].tolist()
        if c in ("fwd", "stack"):  # ids: object ints/None here, float64 with NaN from from_records
            a_col, b_col = (pd.to_numeric(pd.Series(x, dtype=object)).tolist() for x in (a_col, b_col))
        for i, (a, b) in enumerate(zip(a_col, b_col)):
            assert _same(a, b), (c, i, a, b)
    assert compact["record_id"].tolist()[:6] == [0, 0, 0, 1, 1, 3]
    assert compact["call_index"].tolist()[:6] == [0, 0, 0, 0, 0, 0]
    assert compact["module"].tolist()[3] == "" and compact["arg"].tolist()[1] == "0"
    assert compact["shape"].tolist()[:2] == [(2, 3), ()] and compact["producer"].tolist()[:4] == [None, None, None, (0, 0)]
    assert compact.loc[3, ["max", "min"]].tolist() == [float("inf"), float("-inf")]
    # text stays plain object columns (pandas >= 3 would infer its slower "str" dtype)
    for c in ("name", "op", "phase", "module", "io", "arg", "kind", "dtype"):
        assert compact[c].dtype == object, c
    assert compact["tensor"].iloc[1].path == unit.path / "tensors" / "x.safetensors"
    assert compact["kind"].iloc[5] == "none" and compact["shape"].iloc[5] is None
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


# ---- values of the wrong type: reported as damage (file, line, what), the record never compared ----

def _rec(i, **over):
    r = {"id": i, "name": f"Aten.neg.{i}.forward", "op": "aten.neg.default", "level": "aten", "phase": "forward", "module": "m",
         "call_index": i, "fwd": None, "stack": None, "tensors": [dict(_T), dict(_T, io="output")]}
    r.update(over)
    return r


def _tensor(**over):
    return [dict(_T, **over), dict(_T, io="output")]


def _stats(**over):
    return _tensor(stats=dict(_T["stats"], **over))


BAD_VALUES = [
    ({"tensors": _stats(max="oops")}, "stats.max is a string ('oops'), not a number"),
    ({"tensors": _stats(max="1.5")}, "stats.max is a string ('1.5'), not a number"),
    ({"tensors": _stats(min=[1])}, "stats.min is a list ([1]), not a number"),
    ({"tensors": _stats(mean=True)}, "stats.mean is a boolean (True), not a number"),
    ({"tensors": _stats(norm=None)}, "stats.norm is null (None), not a number"),
    ({"tensors": _tensor(stats={"max": 1.0})}, "stats lacks min, mean, norm, nan, inf"),
    ({"tensors": _tensor(stats="x")}, "stats is a string ('x'), not an object"),
    ({"tensors": _tensor(stats=None)}, "stats is null"),
    ({"tensors": ["oops", dict(_T, io="output")]}, "tensors[0] is a string ('oops'), not an object"),
    ({"tensors": [7]}, "tensors[0] is an integer (7), not an object"),
    ({"tensors": [{"a": 1}]}, "tensors[0] is a tensor without dtype"),
    ({"tensors": "x"}, "tensors is a string, not a list"),
    ({"tensors": _tensor(shape="x")}, "shape is a string ('x'), not a list or null"),
    ({"tensors": _tensor(shape=[-2, 3])}, "shape has a bad value (-2, 3)"),
    ({"tensors": _tensor(shape=[2.5, 3])}, "shape has a bad value (2.5, 3)"),
    ({"tensors": _tensor(shape=[[2], 3])}, "shape has a bad value ([2], 3)"),
    ({"tensors": _tensor(shape=None)}, "tensors[0] is a tensor without shape"),
    ({"tensors": _tensor(stride="q")}, "stride is a string ('q')"),
    ({"tensors": _tensor(stride=[1, None])}, "stride has a bad value (1, None)"),
    ({"tensors": _tensor(kind="zzz")}, "kind has a bad value 'zzz'"),
    ({"tensors": _tensor(io=5)}, "io is an integer (5), not a string"),
    ({"tensors": _tensor(arg=0)}, "arg is an integer (0), not a string"),
    ({"tensors": _tensor(dtype={"odd": 1})}, "dtype is an object"),
    ({"tensors": _tensor(dtype="float+2")}, "dtype has a bad value 'float+2'"),  # a flipped byte: agreed before
    ({"tensors": _tensor(dtype="")}, "dtype has a bad value ''"),
    ({"tensors": _tensor(producer="x")}, "producer is 'x', not [record id, output index]"),
    ({"tensors": _tensor(producer=[1, "a"])}, "producer is [1, 'a']"),
    ({"tensors": _tensor(file="../../etc/passwd", key="k")}, "file has a bad value '../../etc/passwd'"),
    ({"tensors": _tensor(file="/etc/passwd", key="k")}, "file has a bad value '/etc/passwd'"),
    ({"op": ["a"]}, "op is a list (['a']), not a string"),
    ({"op": ""}, "op has a bad value ''"),
    ({"phase": ""}, "phase has a bad value ''"),  # reached compare's matching as a TypeError traceback
    ({"level": ""}, "level has a bad value ''"),
    ({"id": "x"}, "id is a string ('x'), not an integer"),
    ({"id": -4}, "id has a bad value -4"),
    ({"id": True}, "id is a boolean (True), not an integer"),  # True == 1: hid behind id 1 (fuzz seed 745)
    ({"call_index": True}, "call_index is a boolean (True)"),
    ({"call_index": "x"}, "call_index is a string"),
    ({"call_index": None}, "call_index is null"),
    ({"name": 3}, "name is an integer"),
    ({"phase": {"a": 1}}, "phase is an object"),
    ({"fwd": "x"}, "fwd is a string"),
]


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("over, why", BAD_VALUES, ids=[w[:30] for _, w in BAD_VALUES])
def test_wrong_values_are_damage(tmp_path, over, why, compact):
    from torchparity.dump.reader import open_dump, read_unit

    recs = [_rec(i) for i in range(5)]
    recs[2] = _rec(2, **over)
    root = _write_rank(tmp_path / "d", recs)
    w: list[str] = []
    df = read_unit(open_dump(root).unit(0, 0), w, compact=compact)
    lost = damage(w)
    assert len(lost) == 1 and len(w) == 1, w
    assert lost[0].startswith("step0/rank0/records.jsonl: 1 record(s) with wrong values skipped (line 3: ")
    assert why in lost[0] and "\n" not in lost[0]
    assert sorted(df["record_id"].unique()) == [0, 1, 3, 4]  # the damaged record is never compared


def test_wrong_values_many_lines_one_message(tmp_path):
    from torchparity.dump.reader import open_dump, read_unit

    recs = [_rec(i, tensors=_stats(max="oops")) if i % 100 == 7 else _rec(i) for i in range(1000)]
    root = _write_rank(tmp_path / "d", recs)
    w: list[str] = []
    df = read_unit(open_dump(root).unit(0, 0), w, compact=True)
    assert len(w) == 1 and "10 record(s) with wrong values skipped (line 8: " in w[0] and "line 108: " in w[0]
    assert w[0].count("line ") == 3 and " ...); read 990 records" in w[0]
    assert df["record_id"].nunique() == 990


def run_cli(args, capsys):
    from torchparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out + cap.err


def test_compare_refuses_wrong_values(tmp_path, capsys):
    """Issue 13 item 8: `"max": "oops"` was compared as a pass ("no divergence", exit 0)."""

    recs = [_rec(i) for i in range(5)]
    clean = _write_rank(tmp_path / "clean", recs)
    recs[2] = _rec(2, tensors=_stats(max="oops"))
    bad = _write_rank(tmp_path / "bad", recs)
    with pytest.raises(DumpError, match=r"line 3: tensors entry 0: stats.max is a string \('oops'\)"):
        torchparity.compare(bad, clean)
    code, text = run_cli(["compare", str(bad), str(clean), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and "stats.max is a string" in text and len(text.strip().splitlines()) == 1, text
    partial = torchparity.compare(bad, clean, allow_partial=True)  # the rest is compared; record 2 is not
    assert 2 not in set(partial.rows["device_record_id"].dropna().astype(int))


# ---- metadata files of the wrong type or damaged: warnings/damage, never a traceback ----

@pytest.mark.parametrize("version", [None, [1], "2", {"a": 1}])
def test_root_meta_version_of_the_wrong_type(tmp_path, version):
    root = _write_rank(tmp_path / "d", [_rec(i) for i in range(3)])
    (root / "torchparity.json").write_text(json.dumps({"format": "torchparity-dump", "version": version}))
    df = torchparity.load_dump(root)
    assert df["record_id"].nunique() == 3
    assert any("torchparity.json: 'version' is" in w and "not an integer" in w for w in df.attrs["warnings"])


def test_stacks_lines_that_are_not_objects(tmp_path):
    root = _write_rank(tmp_path / "d", [_rec(i) for i in range(3)])
    (root / "step0" / "rank0" / "stacks.jsonl").write_text('[1]\n5\n"x"\n{"id": "a"}\n{"id": 2, "frames": 7}\n'
                                                          '{"id": 3, "frames": ["a.py:1 in f"]}\n')
    assert open_dump(root).stacks(0, 0) == {2: [], 3: ["a.py:1 in f"]}
    # the damaged lines are left out with one line naming the file (they used to vanish unseen)
    warnings: list[str] = []
    assert open_dump(root).stacks(0, 0, warnings) == {2: [], 3: ["a.py:1 in f"]}
    assert len(warnings) == 1 and "stacks.jsonl: 4 damaged line(s) left out (line 1:" in warnings[0]


def test_compare_names_a_damaged_stacks_file(tmp_path):
    def run(root):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))
        with torchparity.dump(str(root), level="aten", model=model, stack=True):
            model(torch.randn(3, 4)).sum().backward()
        return root

    dev, bench = run(tmp_path / "dev"), run(tmp_path / "bench")
    f = dev / "step0" / "rank0" / "stacks.jsonl"
    f.write_text("[1, 2]\n" + f.read_text())
    res = torchparity.compare(dev, bench)
    assert [w for w in res.summary["warnings"] if "stacks.jsonl: 1 damaged line(s) left out" in w]


@pytest.mark.parametrize("text, why", [
    ('{"complete": tr', "footer.json is unreadable"),
    ("[1]", "footer.json holds a list, not an object"),
    ('{"complete": true, "records": "x"}', "'records' is a string"),
    ('{"complete": false, "records": 3}', "'complete' is false"),
    ('{"complete": false, "records": 3, "error": "internal error in the dump writer: File too large"}',
     "the dump writer stopped with an error: internal error in the dump writer: File too large"),
])
def test_damaged_footer_is_reported(tmp_path, text, why):
    root = _write_rank(tmp_path / "d", [_rec(i) for i in range(3)])
    (root / "step0" / "rank0" / "footer.json").write_text(text)
    w: list[str] = []
    for compact in (True, False):
        w = []
        df = read_unit(open_dump(root).unit(0, 0), w, compact=compact)
        assert df["record_id"].nunique() == 3
        lost = damage(w)
        assert len(lost) == 1 and why in lost[0] and "no footer" not in lost[0] and "\n" not in lost[0], w
    with pytest.raises(DumpError, match="footer|writer"):
        torchparity.compare(root, _write_rank(tmp_path / "clean", [_rec(i) for i in range(3)]))


def test_info_shows_the_writer_error(tmp_path, capsys):
    """`torchparity info` said "no footer" although footer.json held the writer's error."""
    root = _write_rank(tmp_path / "d", [_rec(i) for i in range(3)])
    (root / "step0" / "rank0" / "footer.json").write_text(json.dumps(
        {"complete": False, "records": 3, "error": "internal error in the dump writer: File too large"}))
    code, text = run_cli(["info", str(root)], capsys)
    assert code == 0 and "no footer" not in text
    assert "INCOMPLETE (the dump writer stopped with an error: internal error in the dump writer: File too large)" in text
    (root / "step0" / "rank0" / "footer.json").write_text("{oops")
    code, text = run_cli(["info", str(root)], capsys)
    assert code == 0 and "INCOMPLETE (footer.json is damaged)" in text and "no footer" not in text


@pytest.mark.parametrize("name", ["records.jsonl", "header.json", "footer.json", "stacks.jsonl", "other.txt"])
def test_a_file_is_not_a_dump(tmp_path, capsys, name):
    """A file given as the bench dump compared as "agree"; it is refused (one line, exit 2)."""
    root = _write_rank(tmp_path / "d", [_rec(i) for i in range(3)])
    f = root / "step0" / "rank0" / name
    f.touch()
    with pytest.raises(DumpError, match="is a file, not a dump"):
        open_dump(f)
    code, text = run_cli(["compare", str(root), str(f), "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "is a file, not a dump" in text and len(text.strip().splitlines()) == 1, text


def test_msprobe_dump_json_file_is_accepted(tmp_path):
    root = _msprobe_dump(tmp_path / "ms")
    assert open_dump(root / "step0" / "rank0" / "dump.json").format == "msprobe"


# ---- msprobe leaves of the wrong type (issue 13, readers part 2) ---------------------------------

def _edit_msprobe(root, fn):
    p = root / "step0" / "rank0" / "dump.json"
    doc = json.loads(p.read_text())
    fn(doc["data"])
    p.write_text(json.dumps(doc))
    return root


_FWD, _BWD = "Functional.linear.0.forward", "Functional.linear.0.backward"


@pytest.mark.parametrize("edit, why", [
    (lambda d: d[_FWD].update(input_args=None), "'input_args' is null, not a list"),
    (lambda d: d[_FWD].update(input_kwargs=[1]), "'input_kwargs' is a list ([1]), not an object"),
    (lambda d: d[_FWD]["input_args"][0].update(Max="oops"), "input_args.0 'Max' is a string ('oops'), not a number"),
    (lambda d: d[_FWD]["input_args"][0].update(Min=True), "'Min' is a boolean"),
    (lambda d: d[_FWD]["input_args"][0].update(Mean=None), "Mean null but other statistics given"),
    (lambda d: d[_FWD]["input_args"].__setitem__(1, "oops"),
     "input_args.1 is a string ('oops'), not a tensor or value description"),
    (lambda d: d[_FWD]["output"].__setitem__(0, 7), "output.0 is an integer (7), not a tensor or value description"),
    (lambda d: d[_FWD]["input_args"][0].update(shape=[2, -3]), "'shape' is [2, -3], not a list of sizes"),
    (lambda d: d[_FWD]["input_args"][0].update(shape="2x3"), "'shape' is '2x3', not a list of sizes"),
    (lambda d: d[_FWD]["input_args"][0].update(dtype=None), "'dtype' is null"),
    (lambda d: d[_FWD]["input_args"][0].update(dtype="torch.flaot32"), "'dtype' is a string ('torch.flaot32')"),
    (lambda d: d[_FWD]["output"][0].update(data_name="../../x.pt"), "'data_name' is '../../x.pt'"),
    (lambda d: d[_BWD]["input"][0].update(requires_grad="no"), "'requires_grad' is a string"),
    (lambda d: d[_BWD]["output"][0].update(type=3), "'type' is an integer"),
])
def test_msprobe_wrong_values_are_damage(tmp_path, edit, why):
    """Before: these msprobe leaves compared as "agree" (a string leaf became a 'none' row, a bad
    statistic NaN, a null input_args no rows at all)."""
    clean = _msprobe_dump(tmp_path / "clean")
    bad = _edit_msprobe(_msprobe_dump(tmp_path / "bad"), edit)
    w: list[str] = []
    df = read_unit(open_dump(bad).unit(0, 0), w)
    lost = damage(w)
    assert len(lost) == 1 and why in lost[0] and "dump.json" in lost[0] and "\n" not in lost[0], w
    assert "entry with wrong values skipped" in lost[0]
    assert len(df["name"].unique()) == 2  # the damaged entry is left out, the other two are read
    with pytest.raises(DumpError, match="wrong values"):
        torchparity.compare(bad, clean)
    res = torchparity.compare(bad, clean, allow_partial=True)  # what was read still compares
    assert any("wrong values" in x for x in res.summary["warnings"])


def test_msprobe_valid_values_are_not_damage(tmp_path):
    """None arguments, value descriptions, NaN strings, output null (Tensor.__setitem__): valid."""
    def edit(d):
        d[_FWD]["input_args"].append(None)
        d[_FWD]["input_args"].append({"type": "int", "value": 3})
        d[_FWD]["input_args"].append({"type": "torch.Tensor", "dtype": "torch.bool", "shape": [2], "Max": True,
                                      "Min": False, "Mean": None, "Norm": None, "requires_grad": False})
        d[_FWD]["input_args"].append({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [0], "Max": None,
                                      "Min": None, "Mean": None, "Norm": None, "requires_grad": False})
        d[_FWD]["input_kwargs"] = {"bias": None, "dim": {"type": "torch.Size", "value": [2, 3]}}
        d["Tensor.__setitem__.0.forward"] = {"input_args": [], "input_kwargs": {}, "output": None}
        d["Module.layers.0.mlp.MLP.parameters_grad"] = {"weight": [dict(d[_FWD]["input_args"][0])]}
    root = _edit_msprobe(_msprobe_dump(tmp_path / "ms"), edit)
    cons = root / "step0" / "rank0" / "construct.json"
    cons.write_text(json.dumps(dict(json.loads(cons.read_text()), **{"Tensor.__setitem__.0.forward": None})))
    w: list[str] = []
    df = read_unit(open_dump(root).unit(0, 0), w)
    assert not damage(w), w
    grad = df[df["name"] == "Module.layers.0.mlp.MLP.parameters_grad"]
    assert list(grad["io"]) == ["grad"] and list(grad["module"]) == ["layers.0.mlp"]


def test_msprobe_record_missing_from_construct_is_damage(tmp_path):
    """A construct.json that names other records but not this API record (a flipped byte in its
    key): the record lost its module path, so it must not pair silently."""
    root = _msprobe_dump(tmp_path / "ms")
    cons = root / "step0" / "rank0" / "construct.json"
    cons.write_text(cons.read_text().replace('"Functional.linear.0.forward"', '"Gunctional.linear.0.forward"'))
    w: list[str] = []
    read_unit(open_dump(root).unit(0, 0), w)
    lost = damage(w)
    assert len(lost) == 1 and "names no parent for 1 API record(s)" in lost[0] and _FWD in lost[0], w


def test_an_empty_records_file_in_tensor_mode_is_damage_not_a_traceback(tmp_path) -> None:
    """Fuzz seed 88 (session 5): the compact frame of an empty unit lacked the compute_dtype
    column that module records now carry: KeyError out of compare."""
    import torch

    import torchparity
    from torchparity.compare._testing import SyntheticDump

    for side in ("a", "b"):
        d = SyntheticDump(tmp_path / side, "tensor")
        x = torch.ones(3)
        d.op("aten.mul.Tensor", "m", [(x, None)], [x])
        d.close()
    (tmp_path / "a" / "step0" / "rank0" / "records.jsonl").write_text("")
    from torchparity.errors import TorchparityError

    try:
        res = torchparity.compare(str(tmp_path / "a"), str(tmp_path / "b"))
    except TorchparityError:
        return  # a clear refusal is fine
    assert not res.complete or res.diverged
