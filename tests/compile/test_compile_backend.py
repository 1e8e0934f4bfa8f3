"""torchparity.compile_backend: in-graph statistics of compiled forward/backward graphs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn

import torchparity
from torchparity.compile import compile_backend
from torchparity.errors import UsageError

from tests.compile.conftest import train_compiled

pytestmark = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                                reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.act, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(self.act(self.ln(self.fc1(x)))), -1)


def _train(backend=None, steps: int = 3):
    torch.manual_seed(0)
    m = Small()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    return train_compiled(m, backend, steps, lambda run, _: ((run(x) - y) ** 2).mean())


def _records(path):
    return [json.loads(line) for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()]


def test_numerics_unchanged_bitwise(tmp_path):
    base = _train("aot_eager")
    got = _train(compile_backend(tmp_path / "d", inner="eager", summaries="step"))
    assert base[0] == got[0]
    assert all(torch.equal(a, b) for a, b in zip(base[1], got[1]))
    # written by the dump's own writer: its rank lock and Parquet summaries come with it
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if not p.name.startswith(".")) == \
        ["step0", "step1", "step2", "summary", "torchparity.json"]


def test_forward_and_backward_records(tmp_path):
    _train(compile_backend(tmp_path / "d", inner="eager"), steps=1)
    recs = _records(tmp_path / "d")
    fwd = {(r["module"], r["op"]) for r in recs if r["phase"] == "forward"}
    assert {("fc1", "aten.addmm.default"), ("ln", "aten.native_layer_norm.default"),
            ("act", "aten.gelu.default"), ("fc2", "aten.addmm.default")} <= fwd
    bwd = [r for r in recs if r["phase"] == "backward"]
    assert {r["module"] for r in bwd} >= {"fc1", "ln", "act", "fc2"}  # module of the forward node, via seq_nr
    assert all(not r["module"].startswith("_orig_mod") for r in recs)
    assert all(r["flags"]["node_id"] and r["stack"] is not None for r in recs if r["phase"] == "forward")
    # the statistics are the real values: the softmax output's rows sum to 1
    sm = next(r for r in recs if r["op"] == "aten._softmax.default")["tensors"][0]["stats"]
    assert sm["mean"] == pytest.approx(0.25) and 0 < sm["min"] <= sm["max"] <= 1
    header = json.loads((tmp_path / "d" / "step0" / "rank0" / "header.json").read_text())
    assert header["compile"]["graphs"] == {"forward": 1, "backward": 1}
    # the device, as an eager dump's header says it (torchparity info's device column was blank)
    assert header["backend"]["device_type"] == "cpu" and header["backend"]["torch_version"] == torch.__version__
    assert header["prev_step"] is None
    df = torchparity.load_dump(tmp_path / "d")
    assert len(df) == len(recs) and not df.attrs["warnings"]


def test_compare_against_eager_aten_dump(tmp_path):
    with torchparity.dump(tmp_path / "eager", level="aten"):
        _train(None, steps=1)
    _train(compile_backend(tmp_path / "comp", inner="eager"), steps=1)
    res = torchparity.compare(tmp_path / "eager", tmp_path / "comp", output_dir=tmp_path / "out")
    summ = res.summary
    n_comp = len(_records(tmp_path / "comp"))
    # every compiled record is paired with an eager op and none diverges; the eager side has more
    # records (model construction, views, ops the compiled graph fuses away): unmatched there
    paired = res.rows[res.rows["match"] != "unmatched"]  # outputs, and inputs traced to their producers
    assert summ["n_unmatched_bench"] == 0 and paired["bench_record_id"].nunique() == n_comp > 10
    assert summ["n_error"] == 0 and summ["n_warning"] == 0 and not summ["diverged"]


def test_cpu_statistics_equal_the_eager_capture_bitwise(tmp_path):
    """On the CPU the in-graph statistics op computes what the eager capture computes (host_stats,
    in float64): a value equal in both runs has equal statistics, to the last bit."""
    from torchparity.capture.stats import host_stats
    from torchparity.compile.stats_op import value_stats_op

    op = value_stats_op()
    for x in (torch.randn(300, 7), torch.randn(64).bfloat16(), torch.tensor([1.0, float("nan"), float("inf")]),
              torch.randn(5, 40).t()):
        got = op(x)
        assert got.dtype == torch.float64 and got.tolist() == pytest.approx(host_stats(x), nan_ok=True, abs=0, rel=0)
    from torchparity.compile.stats_op import value_stats_many_op

    xs = [torch.randn(300, 7), torch.randn(64).bfloat16(), torch.tensor([1.0, float("nan"), float("inf")])]
    many = value_stats_many_op()(xs)  # the graph's one statistics op: the same rows, to the last bit
    assert many.dtype == torch.float64 and many.shape == (3, 6)
    for row, x in zip(many.tolist(), xs):
        assert row == pytest.approx(host_stats(x), nan_ok=True, abs=0, rel=0)
    with torchparity.dump(tmp_path / "eager", level="aten"):
        _train(None, steps=1)
    _train(compile_backend(tmp_path / "comp", inner="eager"), steps=1)
    def output0(r):
        return next((t.get("stats") for t in r.get("tensors") or [] if t["io"] == "output"), None)

    eager = {(r["module"], r["phase"], r["op"]): output0(r) for r in _records(tmp_path / "eager")}
    comp = [r for r in _records(tmp_path / "comp") if r["phase"] == "forward"]
    same = [r for r in comp if eager.get((r["module"], r["phase"], r["op"])) == output0(r)]
    # every forward value of the compiled graph (fc1, ln, act, fc2, softmax) has the eager statistics
    assert len(comp) >= 5 and len(same) == len(comp)


def test_bad_mode_is_one_line_error(tmp_path):
    with pytest.raises(UsageError, match="mode='md5' is not supported"):
        compile_backend(tmp_path, mode="md5")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        compile_backend(tmp_path / "f")


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")),
                    reason="Inductor needs a C++ compiler on the CPU")
def test_inductor_bitwise_and_records(tmp_path):
    base = _train("inductor")
    got = _train(compile_backend(tmp_path / "d"))
    assert base[0] == got[0]
    assert all(torch.equal(a, b) for a, b in zip(base[1], got[1]))
    recs = _records(tmp_path / "d")
    assert {r["phase"] for r in recs} == {"forward", "backward"}
    assert ("fc1", "aten.addmm.default") in {(r["module"], r["op"]) for r in recs}
    assert {r["module"] for r in recs if r["phase"] == "backward"} >= {"fc1", "ln", "fc2"}


def test_recompile_with_dynamic_shapes_writes_runtime_shapes(tmp_path):
    torch.manual_seed(0)
    cap = compile_backend(tmp_path / "d", inner="eager")
    torch._dynamo.reset()
    run = torch.compile(Small(), backend=cap)  # batch 4: static graph; batch 6: recompiled dynamic
    for batch in (4, 6):
        run(torch.randn(batch, 8)).sum().backward()
        cap.step()
    cap.close()  # the step's write is asynchronous: on disk once closed
    steps = [[json.loads(line) for line in (tmp_path / "d" / f"step{s}" / "rank0" / "records.jsonl").read_text().splitlines()]
             for s in (0, 1)]
    assert cap.header()["graphs"]["forward"] == 2  # the recompile was instrumented too
    fc1 = [next(r for r in recs if r["module"] == "fc1" and r["phase"] == "forward") for recs in steps]
    assert [r["tensors"][0]["shape"] for r in fc1] == [[4, 16], [6, 16]]
    assert fc1[0]["flags"]["node_id"] == fc1[1]["flags"]["node_id"]  # stable across the recompile
    df = torchparity.load_dump(tmp_path / "d")
    assert not df.attrs["warnings"] and len(df) == len(steps[0]) + len(steps[1])


class Broken(Small):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.fc1(x))
        torch._dynamo.graph_break()
        return torch.softmax(self.fc2(self.act(h)), -1)


def test_graph_break_captures_both_graphs(tmp_path):
    torch.manual_seed(0)
    m = Broken()
    ref = m(torch.ones(2, 8))
    cap = compile_backend(tmp_path / "d", inner="eager")
    torch._dynamo.reset()
    out = torch.compile(m, backend=cap)(torch.ones(2, 8))
    out.sum().backward()
    cap.close()
    assert torch.equal(out, ref)
    assert cap.header()["graphs"] == {"forward": 2, "backward": 2}
    recs = _records(tmp_path / "d")
    fwd = [(r["module"], r["op"]) for r in recs if r["phase"] == "forward"]
    assert fwd[:2] == [("fc1", "aten.addmm.default"), ("ln", "aten.native_layer_norm.default")]
    assert ("fc2", "aten.addmm.default") in fwd
    bwd = {(r["module"], r["op"]) for r in recs if r["phase"] == "backward"}
    # each graph's backward nodes get the modules of that graph's forward (seq_nr restarts per graph)
    assert {("act", "aten.gelu_backward.default"), ("ln", "aten.native_layer_norm_backward.default"),
            ("fc1", "aten.mm.default"), ("fc2", "aten.mm.default")} <= bwd


@pytest.mark.parametrize("when", ["close", "off", None])
def test_summaries_option_reaches_the_dump_writer(tmp_path, when):
    """summaries="close"/"off" as for torchparity.dump: no Parquet work at each step's end; with
    "close" they are all there after close(), with "off" (the default: None) none are, and the
    records are the same."""
    base = _train(compile_backend(tmp_path / "step", inner="eager", summaries="step"))
    kw = {} if when is None else {"summaries": when}
    when = when or "default"
    got = _train(compile_backend(tmp_path / when, inner="eager", **kw))
    assert base[0] == got[0]
    assert _records(tmp_path / when) == _records(tmp_path / "step")
    has_summary = (tmp_path / when / "summary").is_dir() and any((tmp_path / when / "summary").rglob("*.parquet"))
    assert has_summary == (when == "close")
    footer = json.loads((tmp_path / when / "step0" / "rank0" / "footer.json").read_text())
    assert footer["summary"] is (when == "close")
    with pytest.raises(UsageError, match="summaries must be one of step, close, off"):
        compile_backend(tmp_path / "x", summaries="sometimes")
