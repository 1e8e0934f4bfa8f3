"""Later steps of a bf16 run against its fp32 reference.

After one AdamW step the two runs' weights differ by design (a key bias whose gradient is noise on
both sides moves by +-lr with a random sign; a conv bias before BatchNorm likewise), so at step 1
every such parameter "already differed when it entered": a user's two-step BERT and CNN runs were
blamed on "check the weights/checkpoint". Parameters carried from a step both dumps trained are no
sources; a fault planted in step 1 is still named there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import torchparity

_OLD_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)



@pytest.mark.parametrize("model", ["cnn", "gru"])
def test_two_clean_steps_agree_and_a_step1_fault_is_named(zoo, model: str, tmp_path: Path) -> None:
    cells = zoo
    spec = cells.ZOO[model]
    try:
        cells._dump(spec, "bf16", tmp_path / "dev", steps=2, level="aten")
    except Exception as exc:  # noqa: BLE001 - an old torch without a bf16 CPU kernel
        if _OLD_TORCH:
            pytest.skip(f"{model} bf16 does not run here: {exc}")
        raise
    cells._dump(spec, "fp32", tmp_path / "bench", steps=2, level="aten")
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert res.root_cause is None and not res.diverged, res.root_cause and res.root_cause.reason

    fault = cells._pin(spec, "bf16", "aten.*mm", spec.fwd_module, "forward", tmp_path, kind="scale", factor=2.0)
    fault = dataclasses.replace(fault, step=1)
    inj = cells._dump(spec, "bf16", tmp_path / "dev1", steps=2, level="aten", faults=[fault])
    assert len(inj) == 1 and inj[0].step == 1
    rc = torchparity.compare(str(tmp_path / "dev1"), str(tmp_path / "bench")).root_cause
    assert rc is not None and rc.step == 1 and rc.module == spec.fwd_module and rc.phase == "forward", rc
