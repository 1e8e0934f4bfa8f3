"""The emulated device backend: reduced precision, fault injection, call indices that match the
dump's record names, and the plugin/registry wiring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.capture.session import tool_work
from torchparity.errors import PluginError
from torchparity.toymodels import make_batches, make_model, train
from torchparity_backend_emulated import EmulatedBackend, Fault, emulate


def _records(path: Path, step: int) -> dict[str, dict]:
    lines = (path / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()
    return {r["name"]: r for r in map(json.loads, lines)}


def _first_changed(a: dict[str, dict], b: dict[str, dict]) -> str | None:
    assert list(a) == list(b), "a fault must not change which ops run"
    for name in a:
        if a[name]["tensors"] != b[name]["tensors"]:
            return name
    return None


def _dump_train(path: Path, n_steps: int = 2, **emu) -> tuple[list[float], object]:
    model, batches = make_model(), make_batches(n_steps)
    with emulate(**emu) as dev:
        with torchparity.dump(str(path), level="aten", mode="statistics"):
            losses = train(model, batches)
    return losses, dev


@pytest.fixture(scope="module")
def clean_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    path = tmp_path_factory.mktemp("clean")
    losses, _ = _dump_train(path)
    return path, losses


def test_fault_hits_exactly_the_dump_record_of_that_name(tmp_path: Path, clean_dump) -> None:
    clean_path, clean = clean_dump
    fault = Fault(op="aten.mm", phase="forward", call=3, step=1, kind="scale", factor=1.5)
    faulty, dev = _dump_train(tmp_path / "faulty", faults=[fault])
    # step 0 untouched (the fault is for step 1): bitwise the same records and loss
    assert _first_changed(_records(clean_path, 0), _records(tmp_path / "faulty", 0)) is None
    assert faulty[0] == clean[0] and faulty[1] != clean[1]
    a, b = _records(clean_path, 1), _records(tmp_path / "faulty", 1)
    assert _first_changed(a, b) == "Aten.mm.3.forward"
    # the injection names the module the dump attributes the op to
    assert len(dev.injections) == 1
    inj = dev.injections[0]
    assert (inj.step, inj.call, inj.phase) == (1, 3, "forward")
    assert inj.module == b["Aten.mm.3.forward"]["module"] == "layers.0.self_attn.o_proj"
    out = [t for t in b["Aten.mm.3.forward"]["tensors"] if t["io"] == "output"][0]["stats"]
    ref = [t for t in a["Aten.mm.3.forward"]["tensors"] if t["io"] == "output"][0]["stats"]
    assert out["max"] == pytest.approx(ref["max"] * 1.5, rel=1e-5)


def test_backward_fault_with_module_pattern_and_nan(tmp_path: Path, clean_dump) -> None:
    fault = Fault(op="mm", module="layers.1.mlp.*", phase="backward", call=None, kind="nan", index=3)
    _, dev = _dump_train(tmp_path / "faulty", n_steps=1, faults=[fault])
    a, b = _records(clean_dump[0], 0), _records(tmp_path / "faulty", 0)
    first = _first_changed(a, b)
    assert first is not None and first.startswith("Aten.mm.") and first.endswith(".backward")
    assert b[first]["module"].startswith("layers.1.mlp.")
    out = [t for t in b[first]["tensors"] if t["io"] == "output"][0]["stats"]
    assert out["nan"] == 1  # one element (index 3), not the whole tensor
    assert dev.injections and all(i.module.startswith("layers.1.mlp.") for i in dev.injections)
    assert all(i.phase == "backward" for i in dev.injections)


def test_reduced_precision_rounds_every_floating_op_and_keeps_dtypes() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    exp_mm = (x.bfloat16() @ y.bfloat16()).float()
    with emulate(dtype="bfloat16"):
        got_mm = x @ y
        z = x.clone()
        z.add_(y)                   # in-place: the rounded result is written back
        to16 = x.to(torch.bfloat16)  # a conversion stays what it is
        idx = torch.arange(4) * 3    # integer ops untouched
    assert got_mm.dtype == torch.float32 and torch.equal(got_mm, exp_mm)
    assert torch.equal(z, (x.bfloat16() + y.bfloat16()).float())
    assert to16.dtype == torch.bfloat16 and torch.equal(to16, x.bfloat16())
    assert idx.tolist() == [0, 3, 6, 9]
    with emulate(dtype="float16"):
        h = torch.sin(x)
    assert torch.equal(h, torch.sin(x.half()).float())


def test_bf16_training_runs_and_differs_from_fp32_but_not_from_itself() -> None:
    fp32 = train(make_model(), make_batches(2))
    with emulate(dtype="bfloat16"):
        a = train(make_model(), make_batches(2))
    with emulate(dtype="bfloat16"):
        b = train(make_model(), make_batches(2))
    assert a == b and a != fp32
    assert all(abs(x - y) < 0.05 for x, y in zip(a, fp32))


def test_no_dtype_no_faults_is_bitwise_identical() -> None:
    ref = train(make_model(), make_batches(2))
    with emulate():
        got = train(make_model(), make_batches(2))
    assert got == ref


def test_tool_work_passes_through_untouched_and_uncounted() -> None:
    x = torch.randn(4, 4)
    with emulate(dtype="bfloat16", faults=[Fault(op="mm", call=0, kind="inf")]) as dev:
        with tool_work():
            own = x @ x            # torchparity's own op: full precision, no fault, not counted
        user = x @ x               # the user's first mm: call 0
    assert torch.equal(own, torch.mm(x, x))
    assert torch.isinf(user).all()
    assert [i.call for i in dev.injections] == [0]


def test_steps_advance_on_optimizer_step_and_by_hand() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    with emulate(faults=[Fault(op="mul", phase=None, call=0, step=2, kind="add", value=1.0)]) as dev:
        for _ in range(2):
            (w * 2).sum().backward()
            opt.step()
            opt.zero_grad()
        assert dev.step == 2
        out = w * 2
        dev.next_step()
        out2 = w * 2
    assert torch.equal(out, w.detach() * 2 + 1) and torch.equal(out2, w.detach() * 2)
    assert [(i.step, i.phase) for i in dev.injections] == [(2, "forward")]


def test_fault_specs_are_validated() -> None:
    with pytest.raises(PluginError, match="kind must be one of"):
        Fault(op="mm", kind="explode")
    with pytest.raises(PluginError, match="unknown key"):
        Fault.from_mapping({"op": "mm", "calls": 3})
    with pytest.raises(PluginError, match="dtype"):
        emulate(dtype="int8")
    b = EmulatedBackend()
    with pytest.raises(PluginError, match="unknown option"):
        b.configure({"precision": "bf16"})
    with pytest.raises(PluginError, match="phase"):
        b.configure({"faults": [{"op": "mm", "phase": "sideways"}]})


def test_plugin_from_plugins_yaml_dumps_as_emulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("version: 1\nbackends:\n  reference: cpu\n  options:\n    emulated:\n      dtype: bfloat16\n"
                   "      faults: [{op: aten.mm, phase: forward, call: 1, kind: inf, index: 0}]\n")
    monkeypatch.setenv("TORCHPARITY_PLUGINS", str(cfg))
    reg = torchparity.get_registry(reload=True)
    backend = reg.backends["emulated"]
    assert backend.is_emulation and "EMULATION" in backend.description
    model, batches = make_model(), make_batches(1)
    with torchparity.dump(str(tmp_path / "d"), level="aten", backend="emulated"):
        train(model, batches)
    header = json.loads((tmp_path / "d" / "step0" / "rank0" / "header.json").read_text())
    env = header["backend"]
    assert env["backend"] == "emulated" and env["emulation"] is True and env["emulated_dtype"] == "bfloat16"
    recs = _records(tmp_path / "d", 0)
    out = [t for t in recs["Aten.mm.1.forward"]["tensors"] if t["io"] == "output"][0]["stats"]
    assert out["inf"] == 1
    before = [t for t in recs["Aten.mm.0.forward"]["tensors"] if t["io"] == "output"][0]["stats"]
    assert before["inf"] == 0
    assert [(i.call, i.phase) for i in backend.mode.injections] == [(1, "forward")]
