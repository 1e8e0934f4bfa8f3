"""The op stream: one interception per op, shared by the dump, the emulated device and third-party
consumers (a plugin's, through the ``torchparity_op_consumers`` hook)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torchparity
from torchparity.capture.op_stream import LAYER_DEVICE, OpConsumer, op_stream
from torchparity.toymodels import TinyConfig, make_batches, make_model, train
from torchparity_backend_emulated import Fault, emulate
from torchparity_backend_emulated.mode import EmulatedDeviceMode


class Recorder(OpConsumer):
    """Remembers every op it is handed: (name, module) of counted ones, and how many in all."""

    needs_modules = True

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[tuple[str, str]] = []

    def on_op(self, call: Any, args: tuple, kwargs: dict, run: Any) -> Any:
        self.calls += 1
        out = run(*args, **kwargs)
        if call.name is not None:
            self.seen.append((call.name, call.module))
        return out


class Boom(OpConsumer):
    """Raises on the first ``mul`` it sees."""

    def on_op(self, call: Any, args: tuple, kwargs: dict, run: Any) -> Any:
        if call.info.base == "mul":
            raise ValueError("boom in on_op")
        return run(*args, **kwargs)


def _ours(stack: list[Any]) -> list[Any]:
    return [m for m in stack if type(m).__module__.startswith("torchparity")]


def _records(path: Path, step: int = 0) -> dict[str, dict]:
    lines = (path / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()
    return {r["name"]: r for r in map(json.loads, lines)}


def _out_stats(rec: dict) -> dict:
    return [t for t in rec["tensors"] if t["io"] == "output"][0]["stats"]


def _train_watching_modes(model: torch.nn.Module, batches: list) -> tuple[list[float], list[list[Any]]]:
    stacks: list[list[Any]] = []
    h = model.register_forward_hook(lambda m, i, o: stacks.append(list(_get_current_dispatch_mode_stack())))
    try:
        return train(model, batches), stacks
    finally:
        h.remove()


SMALL = TinyConfig(dim=32, hidden=64, layers=1)


def test_dump_device_and_own_consumer_share_one_mode_and_one_interception(tmp_path: Path) -> None:
    before = list(_get_current_dispatch_mode_stack())
    ref_model = make_model(cfg=SMALL)
    ref = train(ref_model, make_batches(2, cfg=SMALL))

    # the ops of the same training alone, under one consumer
    solo, solo_model, batches = Recorder(), make_model(cfg=SMALL), make_batches(2, cfg=SMALL)
    n0 = op_stream().intercepted
    with op_stream().attached(solo):
        train(solo_model, batches)
    solo_ops = op_stream().intercepted - n0
    assert solo.calls == solo_ops > 300

    mine, model, batches = Recorder(), make_model(cfg=SMALL), make_batches(2, cfg=SMALL)
    n0 = op_stream().intercepted
    # a fault that never fires: the device path (module tracking, counting) runs, numerics stay
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="statistics", model=model):
        with emulate(faults=[Fault(op="mm", step=99, kind="nan")]) as dev:
            with op_stream().attached(mine, model):
                assert [type(c) for c in op_stream().consumers][-1] is EmulatedDeviceMode
                losses, stacks = _train_watching_modes(model, batches)
    together = op_stream().intercepted - n0
    # exactly one torchparity mode on the dispatch stack while the model ran: the stream's
    assert stacks and all(len(_ours(s)) == 1 for s in stacks)
    assert all(_ours(s)[0] is _ours(stacks[0])[0] for s in stacks)
    # each op intercepted once, whatever the number of consumers
    assert together == mine.calls == solo_ops
    assert dev.injections == []
    # the user's numerics: bitwise those of the tool-off run
    assert losses == ref
    for (k, a), (_, b) in zip(ref_model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), k
    assert list(_get_current_dispatch_mode_stack()) == before
    assert op_stream().consumers == ()
    # the dump recorded every op; the stream's names are the dump's
    recs = _records(tmp_path / "d", 0)
    assert len(recs) > 150 and set(recs) <= {n for n, _ in mine.seen}


def test_device_entered_inside_a_dump_is_still_what_the_dump_records(tmp_path: Path) -> None:
    # the old rule was "enter the device outside the tracker"; the device layer is innermost now
    fault = Fault(op="aten.mm", phase="forward", call=1, kind="inf", index=0)
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="statistics"):
        with emulate(dtype="bfloat16", faults=[fault]) as dev:
            model = make_model()
            train(model, make_batches(1))
    recs = _records(tmp_path / "d", 0)
    assert _out_stats(recs["Aten.mm.1.forward"])["inf"] == 1
    assert _out_stats(recs["Aten.mm.0.forward"])["inf"] == 0
    assert [(i.call, i.phase) for i in dev.injections] == [(1, "forward")]
    # the dump saw what the model saw: float32 tensors holding the emulated device's bf16 values
    rec = recs["Aten.mm.2.forward"]
    assert {t["dtype"] for t in rec["tensors"]} == {"float32"}
    top = _out_stats(rec)["max"]
    assert top == float(torch.tensor(top).bfloat16())


def test_attach_and_detach_in_any_order_leave_the_mode_stack_as_found(tmp_path: Path) -> None:
    before = list(_get_current_dispatch_mode_stack())
    x = torch.randn(4, 4)
    a, b = Recorder(), Recorder()
    for first, second in ((a, b), (b, a)):
        op_stream().attach(a)
        op_stream().attach(b)
        assert len(_ours(list(_get_current_dispatch_mode_stack()))) == 1
        x @ x
        op_stream().detach(first)
        x @ x
        op_stream().detach(second)
        assert list(_get_current_dispatch_mode_stack()) == before
    # a dump and a device left in the order they were not entered
    d = torchparity.dump(str(tmp_path / "d"), level="aten").start()
    dev = EmulatedDeviceMode(dtype="bfloat16")
    dev.__enter__()
    d.stop()
    y = x @ x  # still on the emulated device
    assert torch.equal(y, (x.bfloat16() @ x.bfloat16()).float())
    dev.__exit__(None, None, None)
    assert list(_get_current_dispatch_mode_stack()) == before
    assert torch.equal(x @ x, torch.mm(x, x))
    assert op_stream().consumers == ()


def test_a_consumer_that_raises_propagates_and_the_stream_stays_usable() -> None:
    before = list(_get_current_dispatch_mode_stack())
    boom, rec = Boom(), Recorder()
    x = torch.randn(3)
    op_stream().attach(rec)
    op_stream().attach(boom)
    with pytest.raises(ValueError, match="boom in on_op"):
        x * 2
    x + 1  # other ops still go through the chain
    op_stream().detach(boom)
    assert torch.equal(x * 2, x + x)
    op_stream().detach(rec)
    assert list(_get_current_dispatch_mode_stack()) == before
    assert op_stream().consumers == ()
    # the op that raised was named (mul.0) but never completed; the next one is mul.1
    assert rec.seen[:2] == [("Aten.add.0.forward", ""), ("Aten.mul.1.forward", "")]
    # and it starts again cleanly
    again = Recorder()
    with op_stream().attached(again):
        x * 3
    assert again.seen == [("Aten.mul.0.forward", "")]
    assert list(_get_current_dispatch_mode_stack()) == before


def test_emulated_device_is_a_device_layer_consumer() -> None:
    with emulate(dtype="float16") as dev:
        assert dev in op_stream().consumers and dev.layer == LAYER_DEVICE
        assert op_stream().emulation() is dev and dev.emulated_dtype == torch.float16
        assert dev.torchparity_emulated is True
    assert op_stream().emulation() is None


_PLUGIN = '''
import torchparity
from torchparity import hookimpl

SEEN = []
OPTIONS = []


class PluginRecorder(torchparity.OpConsumer):
    needs_modules = True

    def on_op(self, call, args, kwargs, run):
        out = run(*args, **kwargs)
        if call.name is not None:
            SEEN.append((call.name, call.phase, call.module))
        return out


@hookimpl
def torchparity_op_consumers(options):
    OPTIONS.append(options.level)
    if options.level == "aten":
        yield PluginRecorder()
    yield "not a consumer"
'''


def test_a_plugin_consumer_sees_the_ops_of_a_dumped_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tp_opstream_plugin.py").write_text(_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("version: 1\nplugins:\n  modules: [tp_opstream_plugin]\n")
    monkeypatch.setenv("TORCHPARITY_PLUGINS", str(cfg))
    torchparity.get_registry(reload=True)
    plugin = sys.modules["tp_opstream_plugin"]
    model = make_model()
    with caplog.at_level("WARNING", logger="torchparity"):
        with torchparity.dump(str(tmp_path / "d"), level="aten", mode="statistics", model=model):
            train(model, make_batches(1))
    assert plugin.OPTIONS == ["aten"]
    assert "expected torchparity.OpConsumer" in caplog.text  # the stray string is left out, told once
    assert op_stream().consumers == ()
    recs = _records(tmp_path / "d", 0)
    seen = {name: (phase, module) for name, phase, module in plugin.SEEN}
    # the plugin's consumer saw every op the dump recorded, under the same name, phase and module
    assert len(recs) > 300 and set(recs) <= set(seen)
    for name, r in recs.items():
        assert seen[name] == (r["phase"], r["module"]), name
    assert seen["Aten.mm.0.forward"][1] == "layers.0.self_attn.q_proj"
    assert any(p == "backward" and m.startswith("layers.1.mlp") for p, m in seen.values())
    # at another level the hook is asked too, and this plugin stays out
    with torchparity.dump(str(tmp_path / "m"), level="module"):
        train(make_model(), make_batches(1))
    assert plugin.OPTIONS == ["aten", "module"]
    monkeypatch.delenv("TORCHPARITY_PLUGINS")
    torchparity.get_registry(reload=True)


def test_public_api_exports_the_stream() -> None:
    from torchparity.capture import op_stream as mod

    assert torchparity.OpConsumer is mod.OpConsumer and torchparity.op_stream is mod.op_stream
    assert torchparity.LAYER_DEVICE == mod.LAYER_DEVICE


class StepEnds(OpConsumer):
    """Remembers the step ends it is told about; raises on the first one with ``boom``."""

    def __init__(self, boom: bool = False) -> None:
        self.ends: list[int] = []
        self.boom = boom

    def on_step_end(self, step: int) -> None:
        self.ends.append(step)
        if self.boom and len(self.ends) == 1:
            raise RuntimeError("boom in on_step_end")


def _sgd_step(opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    (p * 2).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_new_optimizer_ends_steps_once_the_first_is_gone_or_left() -> None:
    s, c = op_stream(), StepEnds()
    p = torch.nn.Parameter(torch.ones(3))
    with s.attached(c):
        first = torch.optim.SGD([p], lr=0.1)
        _sgd_step(first, p)
        del first  # garbage: the next optimizer to step takes its place at once
        second = torch.optim.SGD([p], lr=0.1)
        _sgd_step(second, p)
        third = torch.optim.SGD([p], lr=0.1)  # `second` stays alive but the loop moved on
        _sgd_step(third, p)
        _sgd_step(third, p)
        _sgd_step(third, p)
    # first: end 0; second: end 1; third: not yet (second alive), then it stepped twice -> ends
    assert c.ends == [0, 1, 2, 3], c.ends


def test_every_consumer_hears_the_step_end_even_when_one_raises() -> None:
    s, a, b = op_stream(), StepEnds(boom=True), StepEnds()
    with s.attached(a), s.attached(b):
        step0 = s.step
        with pytest.raises(RuntimeError, match="boom in on_step_end"):
            s.next_step()
        assert s.step == step0 + 1
        s.next_step()
    assert a.ends == b.ends == [step0, step0 + 1]
