"""Online compare against the CPU reference, failure cases and replay.

The "device" is the emulated one (torchparity_backend_emulated): bf16 compute on the CPU, with a
planted fault where a test needs one."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.errors import UsageError
from torchparity.online.case import safe_name
from torchparity.online.compare import CompareFailure, CompareWithReference
from torchparity.online.replay import replay
from torchparity.toymodels import make_batches, make_model, train
from torchparity_backend_emulated import Fault, emulate

FAULT = Fault(op="aten.mm", phase="forward", call=5, step=0, kind="scale", factor=1.05)


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("online")
    with emulate(dtype="bfloat16", faults=[FAULT]) as dev:
        with CompareWithReference(save_failures=out / "failures", log_file=out / "compare.log") as c:
            train(make_model(), make_batches(1))
    return out, dev, c


def test_planted_fault_is_the_first_failure_with_its_module(fault_run) -> None:
    out, dev, c = fault_run
    assert len(dev.injections) == 1
    inj = dev.injections[0]
    first = c.first_failure
    assert first is not None
    assert first.name == "Aten.mm.5.forward" and first.op == "aten.mm.default"
    assert first.module == inj.module == "layers.0.mlp.up_proj"
    assert (first.step, first.phase) == (0, "forward")
    # the ops downstream of the fault got corrupted inputs but computed them correctly: one failure
    assert [f.name for f in c.failures] == ["Aten.mm.5.forward"]
    assert first.metrics["device_error"] > 0.04 and first.worst
    log = (out / "compare.log").read_text()
    assert "[torchparity:error] Aten.mm.5.forward (aten.mm.default) module=layers.0.mlp.up_proj" in log
    assert "[torchparity:skip]" in log and "nondeterministic_seeded" in log and "view" in log
    assert "[torchparity:summary] checked" in log and "1 failed" in log


def test_saved_case_is_safetensors_and_json(fault_run) -> None:
    out, _, c = fault_run
    case = Path(c.first_failure.case)
    assert case.parent == out / "failures" and case.name == "step0_rank0_Aten.mm.5.forward"
    assert sorted(p.name for p in case.iterdir()) == ["case.json", "tensors.safetensors"]
    meta = json.loads((case / "case.json").read_text())
    assert meta["op"] == "aten.mm.default" and meta["device"]["emulated_dtype"] == "bfloat16"
    from safetensors.torch import load_file

    assert {"in.0", "in.1", "out.0", "rng.cpu"} <= set(load_file(str(case / "tensors.safetensors")))


def test_replay_reproduces_the_saved_failure(fault_run) -> None:
    case = fault_run[2].first_failure.case
    res = replay(case)
    assert res.verdict == "error" and res.reproduced
    assert res.failure.module == "layers.0.mlp.up_proj"
    assert res.metrics["device_error"] == pytest.approx(fault_run[2].first_failure.metrics["device_error"])
    # re-run on the CPU (no fault there): the op is fine
    assert replay(case, backend="cpu").verdict == "pass"


def test_replay_cli(fault_run, capsys: pytest.CaptureFixture) -> None:
    from torchparity.cli import main

    case = fault_run[2].first_failure.case
    with pytest.raises(SystemExit) as e:
        main(["replay", case])
    assert e.value.code == 1
    assert "[torchparity:error] Aten.mm.5.forward" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["replay", str(Path(case).parent)])
    assert e.value.code == 2
    assert "not a torchparity failure case" in capsys.readouterr().err


def test_bf16_without_fault_passes_and_compare_does_not_change_results() -> None:
    with emulate(dtype="bfloat16"):
        plain = train(make_model(), make_batches(2))
    with emulate(dtype="bfloat16"):
        with CompareWithReference() as c:
            compared = train(make_model(), make_batches(2))
    assert compared == plain  # bitwise: the tool never touches the model's numbers
    assert c.failures == [] and c.checked > 400 and c.current_step == 2


def test_inplace_ops_are_compared_with_their_inputs_before_the_op() -> None:
    x, y = torch.randn(16), torch.randn(16)
    with emulate(faults=[Fault(op="add_", call=1, kind="add", value=0.5, index=2)]):
        with CompareWithReference() as c:
            a = x.clone()
            a.add_(y)          # call 0: correct, and it mutates `a`
            a.add_(y)          # call 1: faulted
    assert [f.name for f in c.failures] == ["Aten.add_.1.forward"]
    assert c.failures[0].worst[0]["index"] == [2]
    assert c.failures[0].worst[0]["device"] == pytest.approx(c.failures[0].worst[0]["reference"] + 0.5)


def test_skips_random_and_compares_values_only_for_tie_sensitive_ops() -> None:
    x = torch.tensor([3.0, 1.0, 3.0, 2.0])
    with CompareWithReference() as c:
        torch.nn.functional.dropout(x, 0.5, training=True)
        torch.topk(x, 2)
        torch.argmax(x)
    assert c.failures == []
    assert any("nondeterministic_seeded" in r for r in c.skipped)
    assert any("tie-sensitive" in line and "argmax" in line for line in c.log_lines)
    assert not any("topk" in line and "[torchparity:skip]" in line for line in c.log_lines)


def test_nan_from_finite_inputs_is_an_error_nan_carried_is_a_warning() -> None:
    x = torch.ones(4)
    with emulate(faults=[Fault(op="mul", call=0, kind="nan", index=1)]):
        with CompareWithReference() as c:
            y = x * 2          # NaN planted here
            z = y + 1          # carries it: same NaN in the reference run of this op
    assert [f.name for f in c.failures] == ["Aten.mul.0.forward"]
    assert "NaN/Inf" in c.failures[0].reason
    assert c.naninf == ["Aten.mul.0.forward", "Aten.add.0.forward"]
    assert any(line.startswith("[torchparity:naninf] Aten.add.0.forward") for line in c.log_lines)
    assert torch.isnan(z[1])


def test_stop_filters_and_bad_options() -> None:
    x = torch.randn(8, 8)
    with emulate(faults=[Fault(op="mm", call=0, kind="scale", factor=2.0)]):
        with pytest.raises(CompareFailure, match="Aten.mm.0.forward"):
            with CompareWithReference(on_failure="stop"):
                x @ x
                raise AssertionError("not reached: the compare stops at the failing op")
    with emulate(faults=[Fault(op="mm", call=None, step=None, kind="scale", factor=2.0)]):
        with CompareWithReference(ignore_ops=["aten.mm"]) as c1:
            x @ x
        with CompareWithReference(target_ops=["sin"]) as c2:
            x @ x
            x.sin()
        with CompareWithReference(start_step=1) as c3:
            x @ x
            c3.step()
            x @ x
    assert c1.failures == [] and c2.failures == [] and c2.checked == 1
    assert [(f.name, f.step) for f in c3.failures] == [("Aten.mm.0.forward", 1)]
    with pytest.raises(UsageError, match="on_failure"):
        CompareWithReference(on_failure="explode")
    with pytest.raises(UsageError, match="unknown reference backend"):
        with CompareWithReference(reference="nope"):
            pass


def test_case_names_are_sanitized_and_bad_cases_are_clear(tmp_path: Path) -> None:
    assert safe_name("../../etc/passwd") == "etc_passwd"
    assert safe_name("step0_rank0_Aten.mm.5.forward") == "step0_rank0_Aten.mm.5.forward"
    bad = tmp_path / "case"
    bad.mkdir()
    (bad / "case.json").write_text('{"format": "something-else"}')
    with pytest.raises(UsageError, match="not a torchparity case"):
        replay(bad)
    (bad / "case.json").write_text('{"format": "torchparity-case", "version": 1, "op": "aten.mm.default"}')
    with pytest.raises(UsageError, match="tensors.safetensors"):
        replay(bad)


def test_backend_option_runs_the_model_on_the_emulated_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("version: 1\nbackends:\n  options:\n    emulated: {dtype: bfloat16, faults: [{op: sin, kind: inf}]}\n")
    monkeypatch.setenv("TORCHPARITY_PLUGINS", str(cfg))
    torchparity.get_registry(reload=True)
    x = torch.randn(8)
    with torchparity.CompareWithCPU(backend="emulated") as c:
        x.sin()
        x.cos()
    assert c.emulated_dtype == torch.bfloat16
    assert [f.name for f in c.failures] == ["Aten.sin.0.forward"]


def test_nan_the_reference_holds_too_is_information_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A NaN/Inf the reference computes as well (carried in, or a mask's -inf in fp16) is logged
    as information; only the op that made it differ is a warning (a clean model with masks must
    not fill the log with alarms)."""
    x = torch.ones(4)
    with caplog.at_level(logging.INFO, logger="torchparity"):
        with emulate(faults=[Fault(op="mul", call=0, kind="nan", index=1)]):
            with CompareWithReference():
                y = x * 2
                y + 1
    levels = {r.getMessage().split(" (")[0]: r.levelno for r in caplog.records
              if r.getMessage().startswith(("[torchparity:naninf]", "[torchparity:error]"))}
    assert levels["[torchparity:naninf] Aten.add.0.forward"] == logging.INFO
    assert any(k.startswith("[torchparity:error]") and v == logging.WARNING for k, v in levels.items())


def test_a_float32_mask_constant_that_overflows_bfloat16_is_no_failure() -> None:
    """Found by a new-user check (session 15) on an HF Llama: its causal mask fills with
    finfo(float32).min, which is -inf in bfloat16 on every device. The emulated bf16 device failed
    scalar_tensor and where as "NaN/Inf positions differ" although the same-dtype reference is -inf
    at the same positions. A device that overflows where the same-dtype reference does not still
    fails."""
    lo = torch.finfo(torch.float32).min

    def masked(x: torch.Tensor) -> torch.Tensor:
        fill = torch.scalar_tensor(lo, dtype=x.dtype)
        return torch.where(x > 0, x, fill)

    with emulate(dtype="bfloat16"):
        with CompareWithReference() as c:
            masked(torch.randn(4, 8))
    assert c.failures == []

    from torchparity_checker_allclose import AllcloseChecker

    chk = AllcloseChecker()
    chk.configure({})
    high = torch.tensor([1.0, lo, 2.0], dtype=torch.float64)
    same = torch.tensor([1.0, lo, 2.0]).to(torch.bfloat16)  # [1, -inf, 2]
    ok = chk.check_tensors(same.clone(), high, reference_same_dtype=same, reference_high=high)
    assert ok.verdict == "pass", ok
    wrong = torch.tensor([1.0, float("-inf"), float("-inf")], dtype=torch.bfloat16)  # the last -inf is wrong
    bad = chk.check_tensors(wrong, high, reference_same_dtype=same, reference_high=high)
    assert bad.verdict == "error" and "NaN/Inf positions" in bad.reason
