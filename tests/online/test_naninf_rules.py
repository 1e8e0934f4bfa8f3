"""NanInfTracker's shortcuts keep its verdicts: remembered screens are re-measured after any
write (in-place, foreach, through an alias), ops that cannot create a NaN/Inf still let the op
that does be named, and the device-side fold (run on the CPU here) judges like the host path."""

from __future__ import annotations

import pytest
import torch

from torchparity.online import naninf, naninf_screens
from torchparity.online.naninf import NanInfTracker
from torchparity.toymodels import make_batches, make_model, train
from torchparity_backend_emulated import Fault, emulate

INF = float("inf")


def _tracker(host: bool = True, **kw) -> NanInfTracker:
    t = NanInfTracker(**kw)
    t._host_read = host
    return t


def _created(t: NanInfTracker) -> list[tuple[str, int]]:
    return [(f.name, f.step) for f in t.findings if f.kind == "created"]


@pytest.fixture(params=[True, False], ids=["host", "device-fold"])
def host(request: pytest.FixtureRequest) -> bool:
    return request.param


def test_foreach_write_is_screened_and_blamed(host: bool) -> None:
    with _tracker(host) as t:
        x = torch.ones(4) * 1e30
        _ = x + 1  # x is known finite now
        torch._foreach_mul_([x], 1e10)  # overflows x in place (no version bump)
        _ = x + 1  # reads the Inf: a propagator, not the culprit
        t.step()
    assert _created(t) == [("Aten._foreach_mul_.0.forward", 0)]


def test_inplace_write_is_blamed_not_the_reader(host: bool) -> None:
    with _tracker(host) as t:
        x = torch.ones(4) * 1e30
        x.mul_(torch.full((4,), 1e10))
        _ = (x + 1).exp()
        t.step()
    assert _created(t) == [("Aten.mul_.0.forward", 0)]


def test_write_through_a_data_alias_invalidates_the_screen(host: bool) -> None:
    with _tracker(host) as t:
        x = torch.ones(4) * 2
        _ = x + 1  # x screened: finite
        x.data.fill_(float("nan"))  # its own version counter: only the storage says x changed
        _ = x * 3  # reads NaN: not a culprit (fill_ wrote it)
        t.step()
    # a write of a NaN scalar is a creation (issue 14), named at the write, not at the reader
    assert _created(t) == [("Aten.fill_.0.forward", 0)]


def test_inplace_output_is_not_screened_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = naninf._host_fact
    monkeypatch.setattr(naninf_screens, "_host_fact", lambda v: calls.append(v.shape) or real(v))
    with NanInfTracker() as t:
        x = torch.ones(5) * 2  # ones(): known finite (no screen); the product screened (1)
        x.add_(torch.ones(5))  # x is current: only the result (2)
        _ = x * 3  # x current after autograd's version bump: only the output (3)
        t.step()
    assert len(calls) == 3 and t.findings == []


def test_parameters_are_not_screened_again_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(0)
    (inputs, _), = make_batches(1)
    calls = []
    real = naninf._host_fact
    with NanInfTracker(model) as t:
        train(model, make_batches(1))  # step 0: the optimizer (tracked) wrote every parameter
        assert t.current_step == 1
        monkeypatch.setattr(naninf_screens, "_host_fact", lambda v: calls.append(v) or real(v))
        model(inputs)  # step 1 reads them again: their screens from step 0 still hold
    params = {id(p) for p in model.parameters()}
    assert calls and not any(id(v) in params for v in calls)
    assert t.findings == []


def test_propagation_through_non_creating_ops_is_not_blamed(host: bool) -> None:
    with _tracker(host) as t:
        w = torch.ones(3, 4)
        bad = (w * 0).log()  # the culprit: -inf from finite inputs
        c = torch.cat([bad, w]).relu().index_select(0, torch.tensor([0, 4]))
        torch.where(c > 0, c, c.abs()).amax(0).clamp(-1, 1).exp()
        t.step()
    assert _created(t) == [("Aten.log.0.forward", 0)]


def test_selecting_finite_part_of_a_bad_tensor_then_overflowing_is_blamed(host: bool) -> None:
    with _tracker(host) as t:
        c = torch.cat([torch.full((1,), -INF), torch.ones(1) * 1e30])  # -inf asked for
        s = c.index_select(0, torch.tensor([1]))  # finite, though its input is not
        _ = s * 1e20  # overflow: the culprit
        t.step()
    assert _created(t) == [("Aten.mul.1.forward", 0)]


def test_scaling_down_hands_the_screen_on_scaling_up_is_checked(host: bool) -> None:
    with _tracker(host) as t:
        x = torch.ones(1) * 3e38  # one element: its sum screen does not overflow
        _ = x * 0.5
        _ = x / -2.0
        _ = x + 1.0  # a tiny addend cannot overflow
        y = x / 0.5  # overflows: the culprit
        t.step()
        _ = x + 1e38  # overflows too (step 1)
        t.step()
    assert _created(t) == [("Aten.div.1.forward", 0), ("Aten.add.0.forward", 1)]
    assert y.isinf().all()


def test_emulated_fault_in_a_non_creating_op_is_found() -> None:
    # another dispatch mode below the tracker may corrupt any op: no op is trusted then
    fault = Fault(op="aten.relu", phase="forward", step=0, kind="nan", index=1)
    with emulate(dtype=None, faults=[fault]):
        with NanInfTracker() as t:
            x = torch.ones(4) + 1
            _ = (x.relu() * 2).sum()
            t.step()
    assert _created(t) == [("Aten.relu.0.forward", 0)]


def test_model_culprit_on_the_device_fold_path() -> None:
    model = make_model(0)
    fault = Fault(op="aten.mul", module="layers.1.mlp", phase="forward", call=None, step=1, kind="nan", index=3)
    with emulate(dtype=None, faults=[fault]) as dev:
        with _tracker(False, model=model) as t:
            losses = train(model, make_batches(3))
    inj = dev.injections[0]
    assert losses[1] != losses[1]
    assert [(f.kind, f.name, f.module, f.step) for f in t.findings] == \
        [("created", f"Aten.mul.{inj.call}.forward", "layers.1.mlp", 1)]


def test_bad_parameter_entered_on_both_paths(host: bool) -> None:
    model = make_model(0)
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight[3, 5] = INF
    with _tracker(host, model=model) as t:
        train(model, make_batches(2))
    assert [(f.kind, f.module, f.step) for f in t.findings] == [("entered", "layers.0.mlp.up_proj", 0)]


def test_clean_training_identical_and_silent_on_both_paths(host: bool) -> None:
    batches = make_batches(2)
    ref = train(make_model(0), batches)
    model = make_model(0)
    with _tracker(host, model=model) as t:
        losses = train(model, batches)
    assert losses == ref and t.findings == []


def test_accumulating_index_put_is_checked(host: bool) -> None:
    with _tracker(host) as t:
        x = torch.tensor([2.5, 0.0]) * 1e38
        v = torch.ones(1) * 1e38
        x.index_put_((torch.tensor([1]),), v / 10)  # a plain write: cannot create
        x.index_put_((torch.tensor([0]),), v, accumulate=True)  # 4e38: Inf, the culprit
        t.step()
    assert _created(t) == [("Aten.index_put_.1.forward", 0)]


# ---- deferred screens (CPU): an output is screened through its consumer's result ----------------
def test_deferred_producer_is_blamed_not_its_consumers() -> None:
    with NanInfTracker() as t:
        a = torch.ones(2, 2) * 1e20
        y = torch.mm(a, a)  # 2e40: Inf, the culprit
        z = (y.view(4) + torch.ones(4)).pow(2).sum(0)  # each reads the previous result: all deferred
        t.step()
    assert _created(t) == [("Aten.mm.0.forward", 0)] and z.isinf()


def test_deferred_consumer_that_overflows_is_blamed() -> None:
    with NanInfTracker() as t:
        y = torch.ones(1) * 2  # finite (one element: the sum screens cannot overflow)
        z = y * torch.full((1,), 1e38)  # 2e38: finite (deferred)
        _ = z * torch.full((1,), 10.0)  # 2e39: the culprit, consumer of a deferred output
        t.step()
    assert _created(t) == [("Aten.mul.2.forward", 0)]


def test_deferred_output_written_in_place_is_judged_first() -> None:
    with NanInfTracker() as t:
        y = torch.ones(1) * 4  # deferred
        y.mul_(torch.full((1,), 1e38))  # overflows in place: judged after y's own screen
        t.step()
    assert _created(t) == [("Aten.mul_.0.forward", 0)]


def test_deferred_output_read_in_part_by_another_op() -> None:
    with NanInfTracker() as t:
        y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).log()  # -inf: the culprit (deferred)
        y[0].exp()  # a view of it, read by an op that does not carry NaN/Inf through
        t.step()
    assert _created(t) == [("Aten.log.0.forward", 0)]


def test_deferred_backward_culprit_keeps_its_module() -> None:
    model = make_model(0)
    fault = Fault(op="aten.mm", module="layers.0.mlp.down_proj", phase="backward", call=None, step=0, kind="inf",
                  index=0)
    with emulate(dtype=None, faults=[fault]) as dev:
        with NanInfTracker(model) as t:
            t._inherit = True  # the chains run only without other modes; force them on here
            train(model, make_batches(1))
    inj = dev.injections[0]
    f = t.first
    assert (f.name, f.module, f.phase) == (f"Aten.mm.{inj.call}.backward", "layers.0.mlp.down_proj", "backward")


def test_deferred_output_consumed_by_an_op_that_hides_inf() -> None:
    with NanInfTracker() as t:
        z = (torch.tensor([0.0, 1.0]) * 1.5).log().exp()  # log: -inf (the culprit); exp(-inf) = 0 hides it
        _ = torch.where(z > 0, z, z) - torch.ones(2) * 2  # sub reads the finite exp result: fine
        t.step()
    assert _created(t) == [("Aten.log.0.forward", 0)] and torch.isfinite(z).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_preserving_ops_carry_every_nan_and_inf_on_the_cpu(dtype: torch.dtype) -> None:
    """The deferral's premise, checked against the CPU kernels: a NaN/Inf read by one of these
    ops in the listed positions always shows in the result."""
    special = torch.tensor([float("nan"), INF, -INF], dtype=dtype)
    others = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-30, 3e38, -3e38, INF, -INF, float("nan")], dtype=dtype)
    a = special.repeat_interleave(len(others))
    b = others.repeat(len(special))
    ops = {"add": [lambda x, y: x + y, lambda x, y: y + x], "sub": [lambda x, y: x - y, lambda x, y: y - x],
           "mul": [lambda x, y: x * y, lambda x, y: y * x], "div": [lambda x, y: x / y],
           "silu": [lambda x, y: torch.nn.functional.silu(x)], "sqrt": [lambda x, y: x.sqrt()],
           "pow": [lambda x, y, p=p: x.pow(p) for p in (2, 0.5, 1, 3, 1e-3)],
           "sum": [lambda x, y: torch.stack([x, y]).sum(0)], "mean": [lambda x, y: torch.stack([x, y]).mean(0)]}
    assert set(ops) == set(naninf._PRESERVING)
    for name, fns in ops.items():
        for fn in fns:
            assert not torch.isfinite(fn(a, b)).any(), name
