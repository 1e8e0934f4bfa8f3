"""torchparity.compat.maca: the MetaX accuracy recorder (seed 002) over torchparity's engine.

The seed's examples run with only the import changed; where the seed moves the model to a MetaX
GPU (``.cuda()``) the test runs on the CPU, and the device under test is the emulated device
(``torchparity_backend_emulated.emulate``) with a planted fault, so the report has something to find.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchparity
from torchparity.compat import maca as accuracy
from torchparity.errors import UsageError


def _cpu_runs_half_conv() -> bool:
    """torch 2.1 has no float16 conv on the CPU ("slow_conv2d_cpu" not implemented for 'Half')."""
    try:
        F.conv2d(torch.ones(1, 1, 2, 2, dtype=torch.half), torch.ones(1, 1, 1, 1, dtype=torch.half))
    except RuntimeError:
        return False
    return True


needs_half_conv = pytest.mark.skipif(not _cpu_runs_half_conv(), reason="this torch has no float16 conv on the CPU (torch 2.1)")

DEV = "cpu"  # the seed's "cuda" (not available here; see the module docstring)


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    yield tmp_path
    accuracy.stop_record()


def seed_example_1(input, m):
    """Seed 002, first example, from ``m_d = copy.deepcopy(m)`` on (``.cuda()`` → ``.to(DEV)``)."""
    input_d = input.clone().to(DEV)
    m_d = copy.deepcopy(m)
    m_d = m_d.to(DEV)
    accuracy.start_record(record_level=2)
    output = m_d(input_d)
    accuracy.record_switch(False)
    return output


def seed_example_2(input, m):
    input_d = input.clone().to(DEV)
    m_d = copy.deepcopy(m)
    m_d = m_d.to(DEV)
    accuracy.start_record(record_level=2, skip=10, op_range=[None, "torch.nn.Conv1d.6.fwd"])
    output = m_d(input_d)
    accuracy.record_switch(False)
    return output


def seed_setup(shape=(256, 1, 3600)):
    dtype = torch.float16
    out_c, k, s, p, d, g = 4, 5, 1, 2, 1, 1
    torch.manual_seed(0)
    input = torch.randn(shape, dtype=dtype, device="cpu")
    m = nn.Conv1d(shape[1], out_c, k, stride=s, padding=p, dilation=d, groups=g, dtype=dtype)
    return input, m


def names(path="record_dir"):
    df = torchparity.load_dump(path)
    recs = df.drop_duplicates(["step", "rank", "record_id"]).sort_values("record_id")
    return [f["seq_name"] for f in recs["flags"]], df


# ---- the seed's examples -------------------------------------------------------------------------

SEED_SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import copy
    from torchparity.compat import maca as accuracy

    dtype = torch.float16
    shape, out_c, k, s, p, d, g = (256, 1, 3600), 4, 5, 1, 2, 1, 1
    torch.manual_seed(0)
    input = torch.randn(shape, dtype = dtype, device="cpu")
    input_d = input.clone().to("cpu")
    m = nn.Conv1d(shape[1], out_c, k, stride = s, padding = p, dilation = d, groups = g, dtype = dtype)
    m_d = copy.deepcopy(m)
    m_d = m_d.to("cpu")
    accuracy.start_record(record_level=2)
    output = m_d(input_d)
    accuracy.record_switch(False)
''')


@needs_half_conv
def test_seed_example_1_records_and_gen_report_finds_the_faulty_conv(in_tmp):
    from torchparity_backend_emulated import Fault, emulate

    # device0: the seed's script as a program of its own (recording completed at exit)
    Path("ex.py").write_text(SEED_SCRIPT)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "ex.py"], check=True, env=env, timeout=120)
    Path("record_dir").rename("record_cpu")
    assert Path("record_cpu/step0/rank0/records.jsonl").is_file()
    pts = sorted(p.name for p in Path("record_cpu").glob("*.pt"))
    assert pts == ["torch.conv1d.0.fwd.pt", "torch.nn.Conv1d.1.fwd.pt"]
    saved = torch.load("record_cpu/torch.nn.Conv1d.1.fwd.pt", weights_only=True)
    assert saved["inputs"]["0"].shape == (256, 1, 3600) and saved["outputs"]["0"].dtype == torch.float16
    assert any("ex.py" in f for f in saved["stack"])

    # device1: the emulated device, its conv output off by 5 %
    input, m = seed_setup()
    with emulate(dtype=None, faults=[Fault(op="convolution", kind="scale", factor=1.05)]):
        seed_example_1(input, m)
    accuracy.stop_record()
    Path("record_dir").rename("record_emulated")
    report = accuracy.gen_report("./record_cpu", "./record_emulated", "./")
    from openpyxl import load_workbook

    ws = load_workbook(report).active
    rows = list(ws.values)
    assert rows[0] == accuracy.REPORT_COLUMNS
    by = {(r[0], r[1]): dict(zip(rows[0], r)) for r in rows[1:]}
    out = by[("torch.nn.Conv1d.1.fwd", "output.0")]
    assert out["device0_dtype"] == out["device1_dtype"] == "float16"
    assert out["device0_shape"] == "[256, 4, 3600]"
    assert out["diff1"] == pytest.approx(0.05, rel=0.05) and out["diff2"] > 0
    assert out["device1_max"] == pytest.approx(out["device0_max"] * 1.05, rel=1e-2)
    assert "test_maca.py" in out["stack"]
    inp = by[("torch.nn.Conv1d.1.fwd", "input.0")]
    assert inp["diff1"] == 0 and inp["diff2"] == 0


@needs_half_conv
def test_seed_example_2_skip_and_open_range(in_tmp):
    input, m = seed_setup()
    seed_example_2(input, m)
    accuracy.stop_record()
    seq, _ = names()
    # skip=10: the first of every 10 ops; the range [start, torch.nn.Conv1d.6.fwd) never closes here
    assert seq == ["torch.conv1d.0.fwd"]
    assert sorted(p.name for p in Path("record_dir").glob("*.pt")) == ["torch.conv1d.0.fwd.pt"]


# ---- one test per parameter ---------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 5, padding=2)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool1d(1)

    def forward(self, x):
        y = self.act(self.conv(x))
        y = torch.relu(y) + F.relu6(y) + F.prelu(y, torch.ones(1) * 0.25)
        y = y.clone().relu_()
        return self.pool(y)


def run_net(backward=False, **kw):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 1, 32, requires_grad=backward)
    accuracy.start_record(**kw)
    out = net(x)
    if backward:
        out.sum().backward()
    accuracy.stop_record()
    return out


ALL_FWD = ["torch.conv1d.0.fwd", "torch.nn.Conv1d.1.fwd", "torch.nn.functional.relu.2.fwd", "torch.nn.ReLU.3.fwd",
           "torch.relu.4.fwd", "torch.nn.functional.relu6.5.fwd", "torch.Tensor.add.6.fwd", "torch.ones.7.fwd",
           "torch.Tensor.mul.8.fwd", "torch.prelu.9.fwd", "torch.Tensor.add.10.fwd", "torch.Tensor.clone.11.fwd",
           "torch.Tensor.relu_.12.fwd", "torch.adaptive_avg_pool1d.13.fwd", "torch.nn.AdaptiveAvgPool1d.14.fwd",
           "Net.15.fwd"]  # Net is not a torch.nn class: its own name


def test_default_records_every_forward_op_in_order(in_tmp):
    out = run_net(backward=True)
    assert names()[0][:16] == ALL_FWD
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 1, 32, requires_grad=True)
    ref = net(x)
    ref.sum().backward()
    assert torch.equal(out, ref)  # recording does not change the numerics


def test_unreached_op_range_start_warns(in_tmp, caplog):
    run_net(op_range=["torch.nn.Conv1d.99.fwd", None])
    assert "was never reached" in caplog.text


def test_record_level(in_tmp):
    run_net(record_level=2, output_dir="l2")
    run_net(record_level=1, output_dir="l1")
    run_net(record_level=0, output_dir="l0")
    t2, t1, t0 = (torchparity.load_dump(d).query("kind == 'tensor'") for d in ("l2", "l1", "l0"))
    assert t2["tensor"].notna().all() and t2["max"].notna().all()
    assert t1["tensor"].isna().all() and t1["max"].notna().all() and t1["min"].notna().all()
    assert t0["max"].isna().all() and t0["tensor"].isna().all()
    assert list(t1["shape"]) == list(t0["shape"])  # level 0 still names the ops
    s1 = torch.load("l1/torch.nn.Conv1d.1.fwd.pt", weights_only=True)["outputs"]["0"]
    assert set(s1) == {"dtype", "shape", "stride", "max", "min"}


def test_record_stack(in_tmp):
    run_net(output_dir="on")
    run_net(output_dir="off", record_stack=False)
    assert torchparity.load_dump("on")["stack"].notna().any()
    assert torchparity.load_dump("off")["stack"].isna().all()
    assert torch.load("off/torch.prelu.9.fwd.pt", weights_only=True)["stack"] == []


@pytest.mark.parametrize("kw, recorded, empty", [
    ({"record_input": False}, "output", "input"),
    ({"record_output": False}, "input", "output"),
])
def test_record_input_output(in_tmp, kw, recorded, empty):
    run_net(**kw)
    t = torchparity.load_dump("record_dir").query("kind == 'tensor'")
    assert t.loc[t["io"] == recorded, "max"].notna().all()
    assert t.loc[t["io"] == empty, "max"].isna().all()


def test_op_range_accepts_seed_names_closed_open(in_tmp):
    run_net(op_range=["torch.nn.ReLU.3.fwd", "torch.prelu.9.fwd"], output_dir="a")
    assert names("a")[0] == ALL_FWD[3:9]
    run_net(op_range=["torch.prelu.9.fwd", None], output_dir="b")
    assert names("b")[0] == ALL_FWD[9:]
    run_net(op_range=[None, "torch.nn.Conv1d.1.fwd"], output_dir="c")
    assert names("c")[0] == ALL_FWD[:1]


def test_op_range_bwd_names(in_tmp):
    run_net(backward=True, output_dir="all")
    bwd = [s for s in names("all")[0] if s.endswith(".bwd")]
    assert len(bwd) >= 4 and all(s.split(".")[-2].isdigit() for s in bwd)
    end = bwd[3]
    run_net(backward=True, op_range=[None, end], output_dir="cut")
    got = names("cut")[0]
    assert [s for s in got if s.endswith(".fwd")] == [s for s in names("all")[0] if s.endswith(".fwd")]
    assert [s for s in got if s.endswith(".bwd")] == bwd[:3]


def test_op_list_relu_family(in_tmp):
    run_net(op_list=["relu"])
    seq, _ = names()
    assert seq == ["torch.nn.functional.relu.2.fwd", "torch.nn.ReLU.3.fwd", "torch.relu.4.fwd", "torch.Tensor.relu_.12.fwd"]
    run_net(op_list=["torch.prelu.9.fwd"], output_dir="one")
    assert names("one")[0] == ["torch.prelu.9.fwd"]


def test_skip(in_tmp):
    run_net(skip=5)
    assert names()[0] == [ALL_FWD[0], ALL_FWD[5], ALL_FWD[10], ALL_FWD[15]]
    run_net(skip=0, output_dir="all")
    assert len(names("all")[0]) == 16


def test_ranks(in_tmp, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    run_net(ranks=[0], output_dir="r0")
    run_net(ranks=[1], output_dir="r1")
    assert not list(Path("r0").rglob("*.pt"))
    with pytest.raises(Exception):
        names("r0")
    assert len(names("r1")[0]) == 16 and Path("r1/step0/rank1/records.jsonl").is_file()


def test_enabled_false_records_nothing(in_tmp):
    run_net(enabled=False)
    assert not Path("record_dir").exists()


def test_record_switch_pauses_and_resumes(in_tmp):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 1, 32)
    accuracy.start_record()
    torch.sigmoid(x)
    accuracy.record_switch(False)
    assert "torch.sigmoid" in Path("record_dir/step0/rank0/records.jsonl").read_text()  # on disk already
    net(x)
    accuracy.record_switch(True)
    torch.tanh(x)
    accuracy.stop_record()
    assert names()[0] == ["torch.sigmoid.0.fwd", "torch.tanh.1.fwd"]


def test_record_context_manager(in_tmp):
    x = torch.randn(3)
    with accuracy.record(True, output_dir="ctx", record_level=1):
        torch.exp(x)
    torch.sin(x)
    assert names("ctx")[0] == ["torch.exp.0.fwd"]
    assert Path("ctx/torch.exp.0.fwd.pt").is_file()


@pytest.mark.parametrize("kw", [{"record_level": 3}, {"skip": -1}, {"op_range": ["a"]}, {"op_list": [""]},
                                {"ranks": [-1]}, {"process_group": object()}])
def test_bad_arguments_are_usage_errors(in_tmp, kw):
    with pytest.raises(UsageError):
        accuracy.start_record(**kw)


def test_gen_report_missing_dir_is_usage_error(in_tmp):
    with pytest.raises(UsageError):
        accuracy.gen_report("nope0", "nope1")


def test_process_group_ranks_are_group_ranks(in_tmp):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{in_tmp / 'store'}", rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        run_net(process_group=group, ranks=[0], output_dir="g")
        assert len(names("g")[0]) == 16
        with pytest.raises(UsageError):
            accuracy.start_record(process_group=group, ranks=[1])  # not in the group of size 1
    finally:
        dist.destroy_process_group()


def test_gen_report_level1_and_ops_on_one_side_only(in_tmp):
    from openpyxl import load_workbook

    x = torch.randn(8)
    with accuracy.record(output_dir="d0", record_level=1):
        torch.exp(x)
        torch.sin(x)
    with accuracy.record(output_dir="d1", record_level=1):
        torch.exp(x * 1.01)  # device1 runs an extra op and gets a 1 % error into exp
        torch.sin(x)
    rows = list(load_workbook(accuracy.gen_report("d0", "d1", "rep")).active.values)
    assert Path("rep", accuracy.REPORT_NAME).is_file()
    by = {(r[0], r[1]): dict(zip(rows[0], r)) for r in rows[1:]}
    assert by[("torch.exp.1.fwd", "input.0")]["diff1"] == pytest.approx(0.01, rel=1e-3)
    assert by[("torch.exp.1.fwd", "input.0")]["diff2"] is None  # no tensors at level 1
    assert by[("torch.sin.2.fwd", "output.0")]["diff1"] == 0
    extra = by[("torch.Tensor.mul.0.fwd", "output.0")]
    assert extra["device0_dtype"] is None and extra["device1_dtype"] == "float32"
    assert [r[0] for r in rows[1:]].index("torch.Tensor.mul.0.fwd") < [r[0] for r in rows[1:]].index("torch.exp.1.fwd")
