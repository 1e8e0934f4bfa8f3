"""The device side runs on the emulated bf16 device (backends/emulated): an unfaulted run is
judged against bf16 rounding (no error verdicts), a planted fault is still the root cause."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchparity

pytest.importorskip("torchparity_backend_emulated")

from torchparity.toymodels import make_batches, make_model, train  # noqa: E402


def _emulated_dump(path: Path, cfg, level: str, mode: str, faults: list[dict]) -> Path:
    reg = torchparity.get_registry()
    backend = reg.backend("emulated")
    saved = backend.options
    backend.configure({"dtype": "bfloat16", "faults": faults})
    try:
        model = make_model(0, cfg)
        with torchparity.dump(str(path), level=level, mode=mode, model=model, fsync=False, backend="emulated"):
            train(model, make_batches(1, cfg=cfg))
    finally:
        backend.options = saved
    return path


@pytest.fixture(scope="module")
def emu(tmp_path_factory, small_config):
    root = tmp_path_factory.mktemp("emulated")
    return lambda name, level, mode, faults=(): _emulated_dump(root / name, small_config, level, mode, list(faults))


def test_unfaulted_bf16_vs_fp32_reports_no_error(dumps, emu):
    dev = emu("clean_aten", "aten", "statistics")
    res = torchparity.compare(dev, dumps("aten", "statistics"))
    assert res.summary["n_error"] == 0, res.rows[res.rows["verdict"] == "error"][["device_name", "reason"]].head()
    assert res.root_cause is None and not res.diverged
    assert any("emulated device computing in bfloat16" in w for w in res.summary["warnings"])


def test_unfaulted_bf16_mix_tensor_reports_no_error(dumps, emu):
    res = torchparity.compare(emu("clean_mix", "mix", "tensor"), dumps("mix", "tensor"))
    assert res.summary["n_error"] == 0 and res.root_cause is None


@pytest.mark.parametrize("level,mode,fault,name,op", [
    ("aten", "statistics", {"op": "aten.mm", "phase": "forward", "call": 5, "factor": 1.5},
     "Aten.mm.5.forward", "aten.mm.default"),
    ("aten", "statistics", {"op": "aten.mm", "phase": "forward", "call": 5, "kind": "nan"},
     "Aten.mm.5.forward", "aten.mm.default"),
    ("mix", "tensor", {"op": "aten.mm", "phase": "backward", "call": 5, "factor": 3.0},
     None, "torch.nn.functional.linear"),
])
def test_planted_fault_on_emulated_bf16_is_root_cause(dumps, emu, level, mode, fault, name, op):
    dev = emu(f"f_{level}_{mode}_{fault['phase']}_{fault.get('kind', 'scale')}", level, mode, [fault])
    res = torchparity.compare(dev, dumps(level, mode))
    rc = res.root_cause
    assert rc is not None
    assert rc.op == op and rc.phase == fault["phase"]
    assert rc.module == ("layers.0.mlp.up_proj" if fault["phase"] == "forward" else "layers.1.mlp.up_proj")
    if name:
        assert rc.name == name
