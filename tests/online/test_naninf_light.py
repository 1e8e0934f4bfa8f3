"""The NaN/Inf tracker's schedule and light tier: ``every=N`` / ``steps=[...]`` track op by op on
some steps; ``light="module"`` screens module outputs and the step's sinks on the others."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchparity.capture.op_stream import op_stream
from torchparity.errors import UsageError
from torchparity.online.naninf import NanInfTracker


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.bad_steps: set[int] = set()
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.step in self.bad_steps:
            h = h * torch.log(h.new_tensor(-1.0))  # NaN created here, in the root module's own code
        return self.fc2(h)


class _Masked(nn.Module):
    """An attention-like block: a module returns a -inf mask, a softmax absorbs it."""

    class _Mask(nn.Module):
        def forward(self, n: int) -> torch.Tensor:
            return torch.full((n, n), float("-inf")).triu(1)

    def __init__(self) -> None:
        super().__init__()
        self.mask = self._Mask()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.t() + self.mask(x.shape[0])
        return self.proj(torch.softmax(scores, dim=-1) @ x)


def _train(model: nn.Module, steps: int, x: torch.Tensor) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for i in range(steps):
        model.step = i
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_light_steps_keep_the_numerics_and_find_nothing_on_a_clean_model() -> None:
    x = torch.randn(6, 8)
    torch.manual_seed(0)
    off = _train(_Net(), 5, x)
    torch.manual_seed(0)
    model = _Net()
    with NanInfTracker(model, every=2, light="module") as t:
        on = _train(model, 5, x)
    assert on == off  # bitwise
    assert t.findings == [] and t.absorbed == []


def test_a_nan_on_a_light_step_is_seen_and_the_next_step_names_its_op() -> None:
    """every=3: step 0 tracked, steps 1-2 light, step 3 tracked. The NaN created at steps 1 and 2
    is seen on light step 1 (the first module output holding it: fc2's), step 2 is then tracked
    op by op and names the op."""
    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1, 2}
    with NanInfTracker(model, every=3, light="module") as t:
        _train(model, 3, torch.randn(6, 8))
    kinds = [(f.kind, f.step) for f in t.findings]
    assert kinds[:2] == [("light", 1), ("created", 2)], t.findings
    light, created = t.findings[0], t.findings[1]
    assert light.module == "fc2" and light.phase == "forward" and light.value == "NaN"
    assert light.name == "Module.fc2.Linear.forward.0" and light.op == "" and light.seq == -1
    assert "light tier" in str(light) and "The next step is tracked op by op" in str(light)
    assert "NanInfTracker(model, steps=[1])" in str(light)
    assert created.op == "aten.log.default"
    assert t.first is created  # a light finding names no op: `first` is the first created one


def test_light_finding_does_not_raise_but_the_tracked_step_does() -> None:
    from torchparity.online.naninf import NonFiniteError

    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1, 2}
    with pytest.raises(NonFiniteError) as err:
        with NanInfTracker(model, every=3, light="module", on_failure="raise"):
            _train(model, 3, torch.randn(6, 8))
    assert err.value.finding.step == 2 and err.value.finding.op == "aten.log.default"


def test_an_absorbed_mask_is_no_finding_on_a_light_step() -> None:
    """A module's output holds -inf (a causal mask) that a softmax absorbs: nothing reached a
    sink, so nothing is reported (the light tier follows the tracker's sink rule)."""
    torch.manual_seed(0)
    model = _Masked()
    with NanInfTracker(model, every=4, light="module") as t:
        _train(model, 4, torch.randn(5, 8))
    assert t.findings == []


def test_a_gradient_nan_on_a_light_step_names_the_parameter() -> None:
    class _BadGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x.clone()

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g * float("nan")

    class _M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.step = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return _BadGrad.apply(y) if self.step == 1 else y

    torch.manual_seed(0)
    model = _M()
    with NanInfTracker(model, every=2, light="module") as t:
        _train(model, 2, torch.randn(3, 4))
    assert [(f.kind, f.step, f.phase) for f in t.findings] == [("light", 1, "backward")], t.findings
    assert t.findings[0].name in ("gradient of fc.weight", "gradient of fc.bias") and t.findings[0].module == "fc"


def test_light_steps_leave_the_dispatch_stack() -> None:
    """The forward and backward of a step not tracked op by op intercept no op (the stream is
    paused for the tracker from the step's start: the optimizer step that ends a step is the
    last thing it sees)."""
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(6, 8)
    counts = []
    with NanInfTracker(model, every=2, light="module"):
        for i in range(4):
            model.step = i
            before = op_stream().intercepted
            model(x).pow(2).mean().backward()
            counts.append(op_stream().intercepted - before)
            opt.step()
            opt.zero_grad()
    assert counts[0] > 0 and counts[2] > 0, counts
    assert counts[1] == 0 and counts[3] == 0, counts


def test_steps_without_light_run_untouched_and_unintercepted() -> None:
    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1}
    with NanInfTracker(model, steps=[0, 2]) as t:
        _train(model, 3, torch.randn(6, 8))
    # step 1 was not checked at all: its NaN is not named; step 2 reads the NaN parameters
    assert [(f.kind, f.step) for f in t.findings] == [("entered", 2)], t.findings


@pytest.mark.parametrize("kwargs,match", [
    ({"light": "module"}, "give every=N or steps"),
    ({"every": 0}, "every must be a whole number >= 1 \\(op-level tracking"),
    ({"every": 2, "light": "aten"}, "light must be one of module"),
    ({"steps": [-1]}, "steps must be a list of step numbers"),
])
def test_bad_schedule_is_a_one_line_usage_error(kwargs: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match) as err:
        NanInfTracker(**kwargs)
    assert "\n" not in str(err.value)


def test_parameters_poisoned_by_a_light_step_are_reported_once() -> None:
    """A NaN made on light step 1 reaches the parameters (SGD steps on NaN gradients): step 2
    (tracked op by op) reads them ("entered"), the light steps after it find the parameters
    already non-finite as they begin and say nothing more; stopping right after a step adds no
    finding of a step that never ran."""
    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1}
    with NanInfTracker(model, every=100, light="module") as t:
        _train(model, 6, torch.randn(6, 8))
    assert [(f.kind, f.step) for f in t.findings] == [("light", 1), ("entered", 2)], t.findings


def _inf_weight_net() -> _Net:
    """A net whose fc2.weight holds an Inf before any step."""
    torch.manual_seed(0)
    model = _Net()
    with torch.no_grad():
        model.fc2.weight[0, 0] = float("inf")
    return model


def test_parameters_already_non_finite_on_the_first_light_step() -> None:
    model = _inf_weight_net()
    with NanInfTracker(model, steps=[0], light="module") as t:
        model.step = 0
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for i in range(3):
            model(torch.randn(6, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    kinds = [(f.kind, f.step) for f in t.findings]
    assert kinds == [("entered", 0)], t.findings  # step 0 op by op; the light steps add nothing


def test_a_light_step_names_the_parameter_that_entered_non_finite() -> None:
    model = _inf_weight_net()
    with NanInfTracker(model, steps=[5], light="module") as t:
        model(torch.randn(6, 8)).pow(2).mean().backward()
        t.step()
    assert len(t.findings) == 1, t.findings
    f = t.findings[0]
    assert (f.kind, f.step, f.module, f.value) == ("light", 0, "fc2", "Inf")
    assert f.name == "parameter fc2.weight at the step's start"
    assert "already held Inf" in str(f) and "earlier step" in str(f)


def test_a_stopped_tracker_leaves_no_hook_on_the_stream() -> None:
    """Started and stopped again and again beside another consumer that keeps the op stream's
    module tracking alive: the tracker's module entry and exit hooks (and the schedule's drain,
    when a step ended inside backward) do not pile up on it."""
    from torchparity.capture.op_stream import OpConsumer

    class _Keeper(OpConsumer):
        needs_modules = True

    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(6, 8)
    keeper = _Keeper()
    with op_stream().attached(keeper, model):
        tracker = op_stream().tracker
        before = (len(tracker.on_enter), len(tracker.on_exit))
        for _ in range(3):
            with NanInfTracker(model, every=2, light="module"):
                _train(model, 2, x)
        assert op_stream().tracker is tracker
        assert (len(tracker.on_enter), len(tracker.on_exit)) == before


def test_light_steps_without_a_model_take_the_root_module_seen() -> None:
    """No ``model=``: the root module seen running is whose parameters the light steps screen."""
    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1}
    with NanInfTracker(steps=[0], light="module") as t:
        _train(model, 2, torch.randn(6, 8))
    assert [(f.kind, f.step, f.module) for f in t.findings] == [("light", 1, "fc2")], t.findings


def test_check_on_a_light_step_reads_its_screens_so_far() -> None:
    """``tracker.check()`` mid-step on a light step: the NaN the forward made (the loss holds it)
    is returned at once; the step's end reports it once."""
    torch.manual_seed(0)
    model = _Net()
    model.bad_steps = {1}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(6, 8)
    seen = []
    with NanInfTracker(model, steps=[0], light="module") as t:
        for i in range(2):
            model.step = i
            out = model(x)
            seen.append(t.check())
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert seen[0] is None
    assert seen[1] is not None and (seen[1].kind, seen[1].step, seen[1].module) == ("light", 1, "fc2"), seen
    assert [(f.kind, f.step) for f in t.findings] == [("light", 1)], t.findings
