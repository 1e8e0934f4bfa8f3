"""torchparity.watch: triggers, replay from the snapshot, transient vs reproducible, root cause,
the report, on_trigger, and the user's numerics (tool on == off, also after a replay)."""

from __future__ import annotations

import json

import pytest
import torch

import torchparity
from torchparity.errors import UsageError
from torchparity.watch import WatchTriggered

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("watch_helpers", Path(__file__).with_name("helpers.py"))
_h = importlib.util.module_from_spec(_spec)
sys.modules["watch_helpers"] = _h
_spec.loader.exec_module(_h)
batches, guarded, same_bits, state, stepper = _h.batches, _h.guarded, _h.same_bits, _h.state, _h.stepper


def _train(tmp_path, data, watch: bool = True, dropout: bool = True, **opts):
    model = guarded()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = stepper(model, opt, dropout=dropout)
    w = None
    if watch:
        with torchparity.watch(model, opt, output_dir=tmp_path / "w", **opts) as w:
            for b in data:
                w.run(step, b)
    else:
        for b in data:
            step(b)
    return model, opt, w


def test_nan_at_step_7_only_with_its_batch_is_reproducible_in_its_module(tmp_path):
    with pytest.raises(WatchTriggered) as ei:
        _train(tmp_path, batches(10, bad=7), every=4)
    rep = json.loads((tmp_path / "w" / "watch-report.json").read_text())
    assert ei.value.report["step"] == rep["step"] == 7
    assert rep["trigger"]["kind"] == "nonfinite_loss"
    assert rep["reproducible"] is True and rep["verdict"] == "reproducible"
    rc = rep["root_cause"]
    assert (rc["module"], rc["phase"], rc["op"], rc["name"]) == ("guard", "forward", "aten.sqrt.default", "Aten.sqrt.0.forward")
    assert rep["rank"] == 0 and rep["world_size"] == 1
    assert rep["snapshot_step"] == 4 and [r["step"] for r in rep["replayed"]] == [4, 5, 6]
    assert rep["replay_consistent"] is True  # dropout draws from the RNG: restored per step
    # the replay case re-runs alone, and the full dump of the re-run is there
    case = torchparity.replay(rep["case"])
    assert case.op == "aten.sqrt.default"
    assert (tmp_path / "w" / "dump" / "step0" / "rank0" / "records.jsonl").is_file()
    assert "step 7" in str(ei.value) and "reproducible" in str(ei.value) and "\n" not in str(ei.value)


def test_a_fault_on_the_first_execution_only_is_transient(tmp_path):
    from torchparity_backend_emulated import Fault, emulate

    fault = Fault(op="aten.sqrt", phase="forward", call=0, step=7, kind="nan", index=0)
    with emulate(dtype=None, faults=[fault]) as dev:
        model, opt, w = _train(tmp_path, batches(10), every=4, on_trigger="continue")
    assert len(dev.injections) == 1  # it fired once: on the replay the stream is at a later step
    with emulate(dtype=None, faults=[fault]):
        ref_model, ref_opt, _ = _train(tmp_path, batches(10), watch=False)
    # the clean replay of step 7 is not kept: the run goes on with what it computed (NaN), as unwatched
    assert same_bits(state(model, opt), state(ref_model, ref_opt))
    rep = w.reports[0]
    assert rep["step"] == 7 and rep["reproducible"] is False and rep["verdict"] == "transient"
    assert rep["rerun"]["loss"] == "nan" and isinstance(rep["rerun"]["rerun_loss"], float)
    assert rep["replay_consistent"] is True


def test_loss_spike_triggers_and_the_run_goes_on_as_if_unwatched(tmp_path):
    data = batches(10, spike=8)
    ref_model, ref_opt, _ = _train(tmp_path, data, watch=False)
    model, opt, w = _train(tmp_path, data, every=3, on_trigger="continue")
    assert [t.kind for t in w.triggers] == ["loss_spike"] and w.triggers[0].step == 8
    rep = w.reports[0]
    assert rep["reproducible"] is True and rep["snapshot_step"] == 6 and rep["replay_consistent"] is True
    assert rep["trigger"]["threshold"] > 0 and rep["trigger"]["value"] > rep["trigger"]["threshold"]
    assert same_bits(state(model, opt), state(ref_model, ref_opt))  # replay restored the run's own state
    assert torch.equal(torch.get_rng_state(), _rng_after(data))


def _rng_after(data):
    _train(None, data, watch=False)
    return torch.get_rng_state()


def test_tool_on_equals_tool_off_when_nothing_triggers(tmp_path):
    data = batches(10)
    ref_model, ref_opt, _ = _train(tmp_path, data, watch=False)
    model, opt, w = _train(tmp_path, data, every=3)
    assert w.triggers == [] and w.step == 10
    assert same_bits(state(model, opt), state(ref_model, ref_opt))
    assert not (tmp_path / "w" / "watch-report.json").exists()


def test_on_trigger_exit_exits_with_the_documented_code(tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        _train(tmp_path, batches(10, bad=2), every=4, on_trigger="exit")
    assert ei.value.code == torchparity.watch.EXIT_CODE == 3
    assert "exiting with code 3" in capsys.readouterr().err
    assert json.loads((tmp_path / "w" / "watch-report.json").read_text())["step"] == 2


def test_grad_norm_spike_and_nonfinite_grad_triggers():
    from torchparity.watch.triggers import CheapTier

    tier = CheapTier(window=4, min_window=3, loss_spike=10.0, grad_spike=10.0)
    for s in range(3):
        assert tier.judge(s, 1.0, 2.0) is None
    t = tier.judge(3, 1.0, 25.0)
    assert (t.kind, t.step, t.threshold) == ("grad_spike", 3, 20.0)
    assert tier.judge(4, 1.0, float("inf")).kind == "nonfinite_grad"
    assert tier.judge(5, 11.0, 2.0).kind == "loss_spike"
    scaled = CheapTier(window=4, min_window=3, loss_spike=None, grad_spike=None, scaler=True)
    assert scaled.judge(0, 1.0, float("inf")) is None  # a GradScaler skips such steps itself


@pytest.mark.parametrize("kwargs, msg", [
    ({"on_trigger": "panic"}, "on_trigger must be one of raise, continue, exit"),
    ({"every": 0}, "every must be a whole number >= 1"),
    ({"loss_spike": 0.5}, "loss_spike must be a factor > 1"),
    ({"memory_budget": "lots"}, "memory_budget must be a positive size"),
    ({"exit_code": 0}, "exit_code must be a whole number from 1 to 255"),
    ({"reference": "abacus"}, "unknown reference backend 'abacus'"),
    ({"window": 5, "bogus": 1}, "unknown option"),
])
def test_bad_options_are_one_line(tmp_path, kwargs, msg):
    model = guarded()
    with pytest.raises(UsageError) as ei:
        torchparity.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), output_dir=tmp_path, **kwargs)
    assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_bad_arguments_are_one_line(tmp_path):
    model = guarded()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (tmp_path / "file").write_text("x")
    cases = [
        (lambda: torchparity.watch("model", opt, output_dir=tmp_path), "model must be a torch.nn.Module"),
        (lambda: torchparity.watch(model, None, output_dir=tmp_path), "optimizer must be a torch.optim.Optimizer"),
        (lambda: torchparity.watch(model, opt, output_dir=tmp_path / "file"), "is a file"),
        (lambda: torchparity.watch(model, opt), "output_dir must be a directory path"),
        (lambda: torchparity.watch(model, opt, output_dir=tmp_path, every=2, memory_budget=100).__enter__().run(
            stepper(model, opt), batches(1)[0]), "over memory_budget="),
        (lambda: torchparity.watch(model, opt, output_dir=tmp_path / "a").run(stepper(model, opt), None), "not running"),
    ]
    for fn, msg in cases:
        with pytest.raises(UsageError) as ei:
            fn()
        assert msg in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    with torchparity.watch(model, opt, output_dir=tmp_path / "b") as w:
        with pytest.raises(UsageError, match="must return the loss"):
            w.run(lambda b: None, batches(1)[0])


def test_grad_scaler_state_is_snapshotted_and_restored(tmp_path):
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler (torch >= 2.3) is needed for a CPU grad scaler")
    data = batches(8, spike=6)

    def run(watch: bool):
        model = guarded()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

        def step(b):
            loss = torch.nn.functional.mse_loss(model(b[0]), b[1])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return loss

        if not watch:
            for b in data:
                step(b)
            return model, opt, scaler, None
        with torchparity.watch(model, opt, output_dir=tmp_path / "s", scaler=scaler, every=4, on_trigger="continue",
                               min_window=3) as w:
            for b in data:
                w.run(step, b)
        return model, opt, scaler, w

    m0, o0, s0, _ = run(False)
    m1, o1, s1, w = run(True)
    assert [t.kind for t in w.triggers] == ["loss_spike"] and w.reports[0]["reproducible"] is True
    assert w.reports[0]["replay_consistent"] is True
    assert same_bits(state(m1, o1), state(m0, o0)) and s1.get_scale() == s0.get_scale()


_MARK = torch.tensor(0.777)


class _BadKernel(torchparity.OpConsumer):
    """A 'device' whose second forward addmm (the head) is wrong (x100) for one batch (the model's
    input has x[0, 0] == 0.777): a data-dependent kernel bug, so the spike reproduces on the re-run."""

    layer = torchparity.LAYER_DEVICE
    marked = False

    def on_op(self, call, args, kwargs, run):
        out = run(*args, **kwargs)
        if call.info.base == "addmm" and call.phase == "forward":
            if call.index == 0:
                self.marked = bool(args[1][0, 0] == _MARK)
            elif self.marked:
                from torchparity.capture.tool_state import tool_work

                with tool_work():
                    out = out * 100.0
        return out


def test_with_a_reference_online_compare_names_the_op_of_a_loss_spike(tmp_path):
    data = batches(10)
    data[8][0][0, 0] = _MARK
    with torchparity.op_stream().attached(_BadKernel()):
        model, opt, w = _train(tmp_path, data, every=4, on_trigger="continue", reference="cpu", window=3, min_window=3,
                                 dropout=False)
    rep = w.reports[0]
    assert rep["step"] == 8 and rep["trigger"]["kind"] == "loss_spike" and rep["reproducible"] is True
    rc = rep["root_cause"]
    assert (rc["name"], rc["module"], rc["phase"], rc["source"]) == ("Aten.addmm.1.forward", "head", "forward", "compare")
    assert rep["case"] and torchparity.replay(rep["case"]).verdict == "error"


def test_memory_budget_counts_the_optimizer_state_once_it_exists(tmp_path):
    model = guarded()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    params = sum(p.numel() * 4 for p in model.parameters())
    # room for the parameters and 2 batches, not for AdamW's two moments (created at the first step)
    budget = params + 2 * (4 * 8 + 4) * 4 + params
    with torchparity.watch(model, opt, output_dir=tmp_path, every=2, memory_budget=budget) as w:
        with pytest.raises(UsageError, match="over memory_budget=") as ei:
            for b in batches(4):
                w.run(stepper(model, opt), b)
    assert w.step == 2 and "\n" not in str(ei.value)


def _record_names(path):
    out = []
    for f in sorted(Path(path).glob("step*/rank0/records.jsonl")):
        out += [(f.parent.parent.name, json.loads(line)["name"]) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_the_cheap_tier_is_invisible_to_a_dump_and_attaches_nothing_per_op(tmp_path):
    data = batches(3)
    seen = []
    for watched in (False, True):
        model = guarded()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = stepper(model, opt)

        def spy(b, step=step):
            seen.append(len(torchparity.op_stream().consumers))
            return step(b)

        with torchparity.dump(str(tmp_path / f"d{watched}"), level="aten", model=model):
            if watched:
                with torchparity.watch(model, opt, output_dir=tmp_path / "w") as w:
                    for b in data:
                        w.run(spy, b)
            else:
                for b in data:
                    spy(b)
    assert _record_names(tmp_path / "dTrue") == _record_names(tmp_path / "dFalse") != []
    assert set(seen) == {1}  # the dump's capture only: the watch adds no consumer of the op stream


def test_a_new_snapshot_is_written_into_the_last_ones_buffers_and_holds_the_live_state(tmp_path):
    """Every ``every`` steps the snapshot is rewritten in place (no new host allocation), and it
    equals the live training state at its step; the optimizer state is copied once, not twice."""
    from torchparity.watch import snapshots

    model = guarded()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = stepper(model, opt)
    copies = []
    real = snapshots._into_host
    snapshots._into_host = lambda t, old: copies.append(t) or real(t, old)

    def host_tensors(snap):
        opt_state = [v for _, st in sorted(snap.optimizer["state"].items()) for _, v in sorted(st.items())
                     if isinstance(v, torch.Tensor)]
        return [v for _, v in sorted(snap.model.items())] + opt_state

    def live_tensors():
        opt_state = [v for _, st in sorted(opt.state_dict()["state"].items()) for _, v in sorted(st.items())
                     if isinstance(v, torch.Tensor)]
        return [v.detach().clone() for _, v in sorted(model.state_dict().items())] + [v.clone() for v in opt_state]

    ptrs = []
    try:
        with torchparity.watch(model, opt, output_dir=tmp_path, every=2) as w:
            for i, b in enumerate(batches(5)):
                live = live_tensors()  # the state the snapshot due before this step must hold
                w.run(step, b)
                if i in (2, 4):
                    got = host_tensors(w.history.snapshot)
                    assert same_bits(got, live), i
                    ptrs.append([t.data_ptr() for t in got])
    finally:
        snapshots._into_host = real
    assert ptrs[0] == ptrs[1]  # the step-4 snapshot lives in the step-2 snapshot's buffers
    n_state = sum(1 for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    n_model = len(model.state_dict())
    assert len(copies) == 3 * (n_model + n_state) - n_state  # snapshots at steps 0, 2, 4 (no optimizer state at 0)


def test_the_snapshot_copied_while_the_step_runs_is_the_state_before_the_step(tmp_path):
    """Parameters and optimizer state are copied on a background thread while the forward and
    backward run: slowed down here so that the whole forward and backward run before the copy.
    The snapshot is still the state before the step (BatchNorm's running statistics, which the
    forward writes, are copied before it starts; the optimizer step waits for the copy), and the
    training is bitwise the same as without the watch."""
    import threading
    import time

    from torchparity.watch import snapshots

    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step_of(m, opt):
        def step(b):
            loss = torch.nn.functional.mse_loss(m(b[0]), b[1])
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    data = batches(5)
    m0, o0 = make()
    for b in data:
        step_of(m0, o0)(b)

    real = snapshots._into_host
    seen_threads = set()

    def slow(t, old):
        if threading.current_thread() is not threading.main_thread():
            seen_threads.add(threading.current_thread().name)
            time.sleep(0.01)  # the copy lags behind the step's forward and backward
        return real(t, old)

    m, opt = make()
    snapshots._into_host = slow
    try:
        # snapshot_share=None: the slowed copy must not space the snapshots out (steps 0, 2, 4)
        with torchparity.watch(m, opt, output_dir=tmp_path, every=2, snapshot_share=None) as w:
            for i, b in enumerate(data):
                before = {k: v.detach().clone() for k, v in m.state_dict().items()}
                before_opt = [v.clone() for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
                w.run(step_of(m, opt), b)
                if i in (2, 4):
                    snap = w.history.snapshot
                    assert same_bits([snap.model[k] for k in before], list(before.values())), i
                    got_opt = [v for st in snap.optimizer["state"].values() for v in st.values()
                               if isinstance(v, torch.Tensor)]
                    assert same_bits(got_opt, before_opt), i
    finally:
        snapshots._into_host = real
    assert seen_threads == {"torchparity-watch-snapshot"}
    assert same_bits(state(m, opt), state(m0, o0))
    assert torch.equal(m[1].running_mean, m0[1].running_mean)


def test_a_costly_snapshot_spaces_the_snapshots_out_and_the_replay_still_finds_the_step(tmp_path):
    """snapshot_share (default 0.02): a snapshot that costs more than 2 % of the steps between two
    (and more than 50 ms) is taken less often, up to 10 x every; a NaN at step 12 is still replayed
    from the last snapshot and found reproducible, and the report gives the interval used. A cheap
    snapshot (the same model without the slowed copy) keeps exactly every K steps."""
    import time

    from torchparity.watch import snapshots

    real = snapshots._into_host

    def slow(t, old):
        time.sleep(0.02)  # ~0.1 s per snapshot: far over 2 % of a ~1 ms step
        return real(t, old)

    snapshots._into_host = slow
    try:
        with pytest.raises(WatchTriggered):
            _, _, w = _train(tmp_path, batches(14, bad=12), every=2)
    finally:
        snapshots._into_host = real
    rep = json.loads((tmp_path / "w" / "watch-report.json").read_text())
    assert rep["snapshot_interval"] == 20  # 10 x every: the longest it spaces them
    assert rep["snapshot_step"] == 0 and [r["step"] for r in rep["replayed"]] == list(range(12))
    assert rep["step"] == 12 and rep["reproducible"] is True
    assert rep["root_cause"]["op"] == "aten.sqrt.default"

    with pytest.raises(WatchTriggered):
        _train(tmp_path / "cheap", batches(14, bad=12), every=2)
    rep = json.loads((tmp_path / "cheap" / "w" / "watch-report.json").read_text())
    assert rep["snapshot_interval"] == 2 and rep["snapshot_step"] == 12


def test_snapshot_share_none_keeps_every_k_and_bad_values_are_one_line(tmp_path):
    import time

    from torchparity.watch import snapshots

    real = snapshots._into_host
    snapshots._into_host = lambda t, old: (time.sleep(0.02), real(t, old))[1]
    try:
        with pytest.raises(WatchTriggered):
            _train(tmp_path, batches(8, bad=6), every=2, snapshot_share=None)
    finally:
        snapshots._into_host = real
    rep = json.loads((tmp_path / "w" / "watch-report.json").read_text())
    assert rep["snapshot_interval"] == 2 and rep["snapshot_step"] == 6
    for bad in (0, 1, 1.5, -0.1, True, "2%"):
        with pytest.raises(UsageError, match="snapshot_share must be a fraction"):
            torchparity.watch(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                              output_dir=tmp_path / "x", snapshot_share=bad)
