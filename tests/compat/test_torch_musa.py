"""The torch_musa compare-tool seed (seed 000) with only the import changed, run on CPU.

Where the seed runs on a MUSA device, the "device" here is torchparity's EMULATED device
(torchparity_backend_emulated: CPU compute with planted faults), not hardware."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import torchparity.compat.torch_musa as tm
from torchparity.compat.torch_musa import (CompareWithCPU, ModuleInfo, NanInfTracker, compare_for_single_op,
                                           nan_inf_track_for_single_op, open_module_tracker)
from torchparity.errors import UsageError
from torchparity.online.compare import CompareFailure
from torchparity_backend_emulated import Fault, emulate

ERR = "[ERROR] Net/Block/Linear/torch.ops.aten.addmm(forward) fails to pass CompareWithCPU test"
#: the second Linear of the second Block computes 5% too large on the "device", every step
FAULT = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="scale", factor=1.05)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def get_your_model() -> Net:
    torch.manual_seed(0)
    return Net()


_OPT: dict[int, torch.optim.Optimizer] = {}


def train_step(model: nn.Module) -> torch.Tensor:
    opt = _OPT.setdefault(id(model), torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def train(model: nn.Module) -> torch.Tensor:
    return train_step(model)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    tm._TRACKED.clear()
    _OPT.clear()
    monkeypatch.delenv("RANK", raising=False)
    yield
    tm._TRACKED.clear()


# ---- seed examples -----------------------------------------------------------------------------


def test_compare_with_cpu_basic_example(capsys) -> None:
    model = get_your_model()
    with emulate(faults=[FAULT]) as dev:
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True) as c:
            train(model)
    out = capsys.readouterr().out
    assert len(dev.injections) == 1
    assert [f.name for f in c.failures] == ["Aten.addmm.1.forward"]
    # no open_module_tracker: no module prefixes
    assert "[ERROR] torch.ops.aten.addmm(forward) fails to pass CompareWithCPU test" in out
    for marker in ("....... input .........", "...... output ........", "...... compare with cpu .......",
                   "Tensor values are not close", "is not close:", "(device) vs ", "(cpu)",
                   "torch.ops.aten.addmm(forward) starts to run ...",
                   "torch.ops.aten.addmm(forward) succeeds to pass CompareWithCPU test",
                   "-------------------------  step = 0  ----------------------"):
        assert marker in out, marker
    assert out.count("[ERROR]") == 1


def test_enabled_false_does_nothing(capsys) -> None:
    ref_model, model = get_your_model(), get_your_model()
    with emulate(faults=[FAULT]):
        expected = train(ref_model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(enabled=False, atol=0.001, rtol=0.001, verbose=True) as c:
            got = train(model)
    assert capsys.readouterr().out == ""
    assert c.engine is None and c.failures == []
    assert torch.equal(expected, got)  # and the model's numerics are untouched
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_module_tracker_example_prefixes(capsys) -> None:
    model = get_your_model()
    info = open_module_tracker(model)
    assert info == ModuleInfo(path="", cls="Net", prefix="Net")
    assert ModuleInfo.of(model, "blocks.1.fc").prefix == "Net/Block/Linear"
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True) as c:
            train(model)
    out = capsys.readouterr().out
    assert ERR in out
    assert "Net/Block/ReLU/torch.ops.aten.relu(forward) succeeds to pass CompareWithCPU test" in out
    assert "Net/Block/Linear/torch.ops.aten.mm(backward) starts to run ..." in out
    assert c.failures[0].module == "blocks.1.fc"


def test_nan_inf_tracker_example(capsys) -> None:
    model = get_your_model()
    open_module_tracker(model)
    nan = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="nan", index=3)
    with emulate(faults=[nan]):
        with NanInfTracker() as t:
            train(model)
    out = capsys.readouterr().out
    assert [f.name for f in t.findings] == ["Aten.addmm.1.forward"]
    assert out.strip().splitlines() == [
        "[WARNING] Net/Block/Linear/torch.ops.aten.addmm(forward) produces NaN from finite inputs "
        "(step = 0, Aten.addmm.1.forward)"]


def test_compare_reports_nan_as_warning_and_error(capsys) -> None:
    nan = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="nan", index=3)
    with emulate(faults=[nan]):
        with CompareWithCPU(atol=0.001, rtol=0.001, target_op=["torch.ops.aten.addmm"]):
            train(get_your_model())
    out = capsys.readouterr().out
    assert "[WARNING] torch.ops.aten.addmm(forward) has NaN/Inf in its output (Aten.addmm.1.forward)" in out
    assert "[ERROR] torch.ops.aten.addmm(forward) fails to pass CompareWithCPU test" in out


def test_target_op_example_filters(capsys) -> None:
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, target_op=["torch.ops.aten.addmm"], verbose=True) as c:
            train(model)
    out = capsys.readouterr().out
    assert ERR in out
    assert c.engine.checked == 3  # the three addmm of the forward, nothing else
    assert "aten.mm(backward)" not in out and "aten.relu" not in out
    # the failing op outside the targets: not compared, not reported
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, target_op=["torch.ops.aten.mm"]) as c2:
            train(get_your_model())
    assert c2.failures == [] and c2.engine.checked == 5  # the backward mm


def test_tolerance_example_changes_the_verdict(capsys) -> None:
    near = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="scale", factor=1.005)
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[near]):
        with CompareWithCPU(atol=0.001, rtol=0.001, target_op=["torch.ops.aten.addmm"]) as strict:
            train(model)
    assert ERR in capsys.readouterr().out and len(strict.failures) == 1
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[near]):
        with CompareWithCPU(atol=0.01, rtol=0.01, target_op=["torch.ops.aten.addmm"]) as loose:
            train(model)
    assert "[ERROR]" not in capsys.readouterr().out and loose.failures == [] and loose.engine.checked == 3
    # each of atol and rtol counts on its own
    with emulate(faults=[near]):
        with CompareWithCPU(atol=1.0, rtol=0.0, target_op=["torch.ops.aten.addmm"]) as only_atol:
            train(get_your_model())
    with emulate(faults=[near]):
        with CompareWithCPU(atol=0.0, rtol=0.1, target_op=["torch.ops.aten.addmm"]) as only_rtol:
            train(get_your_model())
    assert only_atol.failures == [] and only_rtol.failures == []


def test_white_list_example(capsys) -> None:
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, white_list=["torch.ops.aten.addmm"]) as c:
            train(model)
    out = capsys.readouterr().out
    assert c.failures == [] and "[ERROR]" not in out
    assert out.count("Net/Block/Linear/torch.ops.aten.addmm(forward) is in white_list, pass") == 2
    assert "Net/Linear/torch.ops.aten.addmm(forward) is in white_list, pass" in out
    assert c.engine.checked > 0  # the other ops were compared


def test_dump_error_data_and_single_op_reproduction(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with pytest.raises(CompareFailure) as ei:  # "the program stops at the first failure"
            with CompareWithCPU(atol=0.01, rtol=0.01, verbose=True, target_op=["torch.ops.aten.addmm"],
                                dump_error_data=True, output_dir="path_to_save"):
                train(model)
    assert ERR in capsys.readouterr().out
    case = Path("path_to_save") / "step0_rank0_Aten.addmm.1.forward"
    assert ei.value.failure.case == str(case)
    assert sorted(p.name for p in case.iterdir()) == ["case.json", "tensors.safetensors"]
    from safetensors.torch import load_file

    keys = set(load_file(str(case / "tensors.safetensors")))
    assert {"in.0", "in.1", "in.2", "out.0"} <= keys
    assert json.loads((case / "case.json").read_text())["op"] == "aten.addmm.default"

    # the seed's reproduction call, unchanged
    correct, args, kwargs, out = compare_for_single_op('path_to_save/torch.ops.aten.addmm_inputs.pkl',
                                                       torch.ops.aten.addmm, atol=0.01, rtol=0.01)
    assert correct is False and len(args) == 3 and kwargs == {} and out.shape == (4, 8)
    assert not torch.allclose(out, torch.addmm(*args), atol=0.01, rtol=0.01)  # the saved device output
    # atol/rtol are the verdict's
    assert compare_for_single_op('path_to_save/torch.ops.aten.addmm_inputs.pkl', torch.ops.aten.addmm,
                                 atol=1.0, rtol=1.0)[0] is True
    # re-run on a backend (the plain CPU computes it right)
    assert compare_for_single_op(case, torch.ops.aten.addmm, atol=0.01, rtol=0.01, backend="cpu")[0] is True
    correct, args, kwargs, out = nan_inf_track_for_single_op('path_to_save/torch.ops.aten.addmm_inputs.pkl',
                                                             torch.ops.aten.addmm)
    assert correct is True and torch.equal(out, torch.addmm(*args))


def test_nan_inf_track_for_single_op_finds_nan(tmp_path) -> None:
    # a failing log (0.5 added on the device) saved as a case; log(-1) is NaN from a finite input
    nan = Fault(op="aten.log", phase="forward", call=0, step=None, kind="add", value=0.5)
    with emulate(faults=[nan]):
        with pytest.raises(CompareFailure):
            with CompareWithCPU(dump_error_data=True, output_dir=tmp_path / "d", target_op=["torch.ops.aten.log"]):
                torch.log(torch.tensor([[-1.0, 2.0]]))
    correct, args, _, out = nan_inf_track_for_single_op(tmp_path / "d" / "torch.ops.aten.log_inputs.pkl",
                                                        torch.ops.aten.log)
    assert correct is False and torch.isnan(out).any()


def test_step_control_example(capsys) -> None:
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True, start_step=5) as compare_with_cpu:
            for epoch in range(2):
                for step in range(3):
                    train_step(model)
                    compare_with_cpu.step()
    # only step() advances step_cnt (optimizer.step() ran 4 times too)
    assert compare_with_cpu.step_cnt == 6 and compare_with_cpu.engine.current_step == 6
    assert [f.step for f in compare_with_cpu.failures] == [5]
    out = capsys.readouterr().out
    assert out.count(ERR) == 1 and "step = 5" in out
    assert out.index("step = 5") < out.index("starts to run")  # nothing compared before step 5


def test_end_step_is_exclusive(capsys) -> None:
    model = get_your_model()
    with emulate(faults=[FAULT]):
        with CompareWithCPU(start_step=1, end_step=2, target_op=["aten.addmm"]) as c:
            for _ in range(3):
                train_step(model)
                c.step()
    assert [f.step for f in c.failures] == [1]
    with pytest.raises(UsageError):
        CompareWithCPU(start_step=2, end_step=2)


def test_should_log_to_file(tmp_path, capsys) -> None:
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True, should_log_to_file=True,
                            output_dir=tmp_path / "path_to_save") as c:
            train(model)
    assert capsys.readouterr().out == ""
    log = tmp_path / "path_to_save" / "compare_with_cpu_rank0.log"
    assert c.log_path == log
    text = log.read_text()
    assert ERR in text and "succeeds to pass CompareWithCPU test" in text


def test_enable_ranks(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANK", "1")
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True, should_log_to_file=True, output_dir=tmp_path,
                            enable_ranks=[0]) as off:
            train(get_your_model())
        with CompareWithCPU(atol=0.001, rtol=0.001, should_log_to_file=True, output_dir=tmp_path,
                            enable_ranks=[1]) as on:
            train(get_your_model())
    assert off.engine is None and off.failures == []
    assert len(on.failures) == 1 and on.failures[0].rank == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare_with_cpu_rank1.log"]
    assert "[ERROR]" in (tmp_path / "compare_with_cpu_rank1.log").read_text()
    # the seed's example as written, on rank 0
    monkeypatch.setenv("RANK", "0")
    model = get_your_model()
    open_module_tracker(model)
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True, should_log_to_file=True,
                            output_dir=tmp_path / "path_to_save", enable_ranks=[0]):
            train(model)
    assert ERR in (tmp_path / "path_to_save" / "compare_with_cpu_rank0.log").read_text()
    assert capsys.readouterr().out == ""


def test_verbose_changes_output(capsys) -> None:
    with emulate(faults=[FAULT]):
        with CompareWithCPU(atol=0.001, rtol=0.001, verbose=False):
            train(get_your_model())
    quiet = capsys.readouterr().out
    assert "[ERROR] torch.ops.aten.addmm(forward)" in quiet
    assert "starts to run" not in quiet and "succeeds to pass" not in quiet


def test_nan_inf_tracker_parameters(tmp_path, monkeypatch, capsys) -> None:
    nan = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="nan", index=3)
    with emulate(faults=[nan]):
        with NanInfTracker(enabled=False) as off:
            train(get_your_model())
        model = get_your_model()
        with NanInfTracker(start_step=1, end_step=2, should_log_to_file=True, output_dir=tmp_path) as t:
            for _ in range(3):
                train_step(model)
                t.step()
    assert off.engine is None and capsys.readouterr().out == ""
    # steps 0 and 2 are outside the window; the NaN from step 0 stays in the parameters, so step 1's
    # first finding is the op that read them
    assert [f.step for f in t.findings] == [1] and t.step_cnt == 3
    assert "[WARNING]" in (tmp_path / "nan_inf_tracker_rank0.log").read_text()
    monkeypatch.setenv("RANK", "1")
    assert NanInfTracker(enable_ranks=[0]).enabled is False and NanInfTracker(enable_ranks=[1]).enabled is True


def test_bad_inputs_are_usage_errors(tmp_path) -> None:
    pkl = tmp_path / "torch.ops.aten.addmm_inputs.pkl"
    with pytest.raises(UsageError, match="no failure case"):
        compare_for_single_op(pkl, torch.ops.aten.addmm)
    pkl.write_bytes(b"\x80\x04N.")
    with pytest.raises(UsageError, match="pickle"):
        compare_for_single_op(pkl, torch.ops.aten.addmm)
    with pytest.raises(UsageError):
        open_module_tracker("not a model")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        CompareWithCPU(atol=-1)


# ---- should_log_to_file: the file only, each error once (issue 13 item 6) ----------------------


def test_should_log_to_file_logs_only_to_the_file_each_error_once(tmp_path, capsys, caplog):
    model = get_your_model()
    open_module_tracker(model)
    nan = Fault(op="aten.addmm", phase="forward", call=1, step=None, kind="nan", index=3)
    with caplog.at_level("INFO", logger="torchparity"):
        with emulate(faults=[FAULT]):
            with CompareWithCPU(atol=0.001, rtol=0.001, should_log_to_file=True, output_dir=tmp_path) as c:
                train(model)
        with emulate(faults=[nan]):
            with NanInfTracker(should_log_to_file=True, output_dir=tmp_path) as t:
                train(get_your_model())
                t.step()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    # nothing of the engine's went to the logging system (it prints on stderr, or on stdout under a
    # user's logging.basicConfig(stream=sys.stdout)); only the emulated device's injection notes did
    assert [r.getMessage() for r in caplog.records if "[torchparity:" in r.getMessage()] == []
    text = (tmp_path / "compare_with_cpu_rank0.log").read_text()
    assert text.count("[ERROR]") == 1 and text.count("Aten.addmm.1.forward") == 1  # the summary names it once
    assert "[torchparity:error]" not in text and "[torchparity:summary] checked" in text
    assert len(c.failures) == 1 and c.engine.log_lines  # the engine's lines are still kept
    nan_text = (tmp_path / "nan_inf_tracker_rank0.log").read_text()
    assert nan_text.count("[WARNING]") == 1 and "[torchparity:NANINF]" not in nan_text and len(t.findings) == 1


def test_stdout_log_has_each_error_once(capsys, caplog):
    with caplog.at_level("INFO", logger="torchparity"):
        with emulate(faults=[FAULT]):
            with CompareWithCPU(atol=0.001, rtol=0.001):
                train(get_your_model())
    out = capsys.readouterr().out
    assert out.count("[ERROR]") == 1 and "[torchparity:error]" not in out
    assert not [r for r in caplog.records if "[torchparity:" in r.getMessage()]


@pytest.mark.parametrize("bad", ["/proc/x", "afile"])
def test_unusable_output_dir_is_one_line_usage_error(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("x")
    for tool in (CompareWithCPU(should_log_to_file=True, output_dir=bad),
                 NanInfTracker(should_log_to_file=True, output_dir=bad)):
        with pytest.raises(UsageError) as e:
            with tool:
                pass
        assert "\n" not in str(e.value) and "output_dir" in str(e.value)
