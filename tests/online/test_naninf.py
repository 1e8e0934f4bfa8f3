"""NanInfTracker: names the op that created a NaN/Inf (not its propagators), on a TinyLlama."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import torchparity
from torchparity.errors import UsageError
from torchparity.online.naninf import MARKER, NanInfTracker, NonFiniteError
from torchparity.toymodels import make_batches, make_model, train
from torchparity_backend_emulated import Fault, emulate


def _nan_fault(**kw) -> Fault:
    spec = dict(op="aten.mul", module="layers.1.mlp", phase="forward", call=None, step=1, kind="nan", index=3)
    spec.update(kw)
    return Fault(**spec)


def test_clean_run_is_bitwise_identical_and_reports_nothing() -> None:
    batches = make_batches(3)
    ref_model = make_model(0)
    ref = train(ref_model, batches)
    model = make_model(0)
    with NanInfTracker(model) as t:
        losses = train(model, batches)
    assert losses == ref  # exact float equality, not approx
    for (n, a), (_, b) in zip(ref_model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), n
    # the causal mask is masked_fill(-inf): asked for, so neither it nor softmax is blamed
    assert t.findings == []
    assert t.current_step == 3


def test_names_the_op_that_created_the_nan_not_its_propagators(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model(0)
    with caplog.at_level(logging.WARNING, logger="torchparity"):
        with emulate(dtype=None, faults=[_nan_fault()]) as dev:
            with NanInfTracker(model) as t:
                losses = train(model, make_batches(3))
    inj = dev.injections[0]
    assert losses[0] == losses[0] and losses[1] != losses[1]  # NaN from step 1 on
    created = [f for f in t.findings if f.kind == "created"]
    # exactly one culprit: step 1's first injected mul; every op downstream only propagated it,
    # and in step 2 the NaN parameters are inputs (no op creates anything there)
    assert len(created) == 1 and t.findings == created
    f = t.first
    assert f.name == f"Aten.mul.{inj.call}.forward"
    assert (f.op, f.module, f.module_class, f.phase, f.step, f.value) == \
        ("aten.mul.Tensor", "layers.1.mlp", "MLP", "forward", 1, "NaN")
    assert f"{MARKER} step 1: Aten.mul.{inj.call}.forward" in caplog.text
    assert "layers.1.mlp" in str(f)


def test_backward_culprit_is_attributed_to_the_forward_module() -> None:
    model = make_model(0)
    fault = Fault(op="aten.mm", module="layers.0.mlp.down_proj", phase="backward", call=None, step=0,
                  kind="inf", index=0)
    with emulate(dtype=None, faults=[fault]) as dev:
        with NanInfTracker(model) as t:
            train(model, make_batches(1))
    inj = dev.injections[0]
    f = t.first
    assert f is not None and len(t.findings) == 1
    assert (f.name, f.module, f.phase, f.step, f.value) == \
        (f"Aten.mm.{inj.call}.backward", "layers.0.mlp.down_proj", "backward", 0, "Inf")


def test_inputs_already_bad_are_not_blamed() -> None:
    model = make_model(0)
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight[3, 5] = float("nan")  # "bad data" from outside
    with NanInfTracker(model) as t:
        train(model, make_batches(2))
    assert t.first is None  # no op created it
    assert len(t.findings) == 1  # reported once, not every step
    f = t.findings[0]
    assert f.kind == "entered" and f.step == 0 and f.module == "layers.0.mlp.up_proj"
    assert f.name.startswith("Aten.mm.") and f.name.endswith(".forward")


def test_scalars_asked_for_are_not_culprits_but_log_of_zero_is() -> None:
    with NanInfTracker() as t:
        x = torch.full((4,), float("-inf"))  # asked for
        y = torch.softmax(torch.cat([x, torch.zeros(4)]), 0)  # finite again
        z = (y * 0).log()  # finite inputs, -inf output: the culprit
        (z + 1).exp()  # propagator
        t.step()
    assert [(f.kind, f.name, f.value, f.step) for f in t.findings] == \
        [("created", "Aten.log.0.forward", "Inf", 0)]


def test_raise_at_step_boundary() -> None:
    model = make_model(0)
    with emulate(dtype=None, faults=[_nan_fault(step=0)]):
        with pytest.raises(NonFiniteError) as err:
            with NanInfTracker(model, on_failure="raise"):
                opt = torch.optim.AdamW(model.parameters())
                for inputs, targets in make_batches(2):
                    logits = model(inputs)
                    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
                    opt.step()  # raises here, at the end of step 0
                    pytest.fail("the step boundary should have raised")
    assert err.value.finding.step == 0 and err.value.finding.module == "layers.1.mlp"
    assert "produced NaN from finite inputs" in str(err.value)
    assert isinstance(err.value, torchparity.TorchparityError)


def test_manual_steps_and_step_filter() -> None:
    with NanInfTracker(steps=[1]) as t:
        torch.zeros(3).log()  # step 0: not checked
        t.step()
        torch.ones(2).div(0.0)  # step 1: checked
        t.step()
    assert [(f.name, f.step) for f in t.findings] == [("Aten.div.0.forward", 1)]


def test_usage_errors() -> None:
    with pytest.raises(UsageError):
        NanInfTracker(on_failure="explode")
    with pytest.raises(UsageError):
        NanInfTracker(model="not a module")  # type: ignore[arg-type]
    t = NanInfTracker().start()
    try:
        with pytest.raises(UsageError):
            t.start()
    finally:
        t.stop()


def test_exported_lazily() -> None:
    assert torchparity.NanInfTracker is NanInfTracker


def test_step_with_only_views_and_copies() -> None:
    with NanInfTracker() as t:
        x = torch.ones(3)
        t.step()
        x.t().clone().detach()  # nothing but aliasing ops in this step
    assert t.findings == []
