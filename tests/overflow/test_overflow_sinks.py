"""``torchparity overflow`` follows the absorbed/harmful rule on real models (issue 14).

T5's relative-position bucket takes ``log(0)`` (-inf) and casts it to integers: created and
absorbed, information, not a finding. A NaN written by a forward hook (``out[..., 3] = nan``, an
in-place write through a view of a clone) reaches the loss: the finding names that write, its
module and phase, on top of the absorbed ``log`` sites that come earlier in op order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))

import torchparity  # noqa: E402
from zoo_models import ZOO, Trainer  # noqa: E402


def _dump(model: str, path: Path, hook: bool = False) -> list[float]:
    spec = ZOO[model]
    tr = Trainer(spec, "fp32")
    if hook:
        def write(_m: Any, _i: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[..., 3] = float("nan")
            return out
        tr.model.get_submodule(spec.hook_module).register_forward_hook(write)
    with torchparity.dump(str(path), model=tr.model, level="aten"):
        return tr.train(1)


def _overflow(dump: Path, out: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "torchparity", "overflow", str(dump), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    report = json.loads((out / "overflow.json").read_text()) if (out / "overflow.json").is_file() else {}
    return r, report


@pytest.mark.parametrize("model", ["t5", "llama-eager"])
def test_clean_model_has_no_finding(tmp_path: Path, model: str) -> None:
    _dump(model, tmp_path / "d")
    r, rep = _overflow(tmp_path / "d", tmp_path / "o")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rep["first_critical"] == [] and rep["counts"] == {"critical": 0, "high": 0, "medium": 0}
    assert "no harmful NaN/Inf found" in r.stdout
    if model == "t5":  # log(0) of the position buckets: listed, as information
        assert [s["op"] for s in rep["sites"]] == ["aten.log.default"] * 2
        assert all(s["site"] == "absorbed" and not s["finding"] for s in rep["sites"])


def test_nan_written_by_a_forward_hook_is_named_at_the_write_on_top(tmp_path: Path) -> None:
    losses = _dump("t5", tmp_path / "d", hook=True)
    assert losses[0] != losses[0]  # the NaN reached the loss
    r, rep = _overflow(tmp_path / "d", tmp_path / "o")
    assert r.returncode == 1, r.stdout + r.stderr
    top = rep["first_critical"][0]
    assert top["op"].startswith("aten.fill_") and top["module"] == ZOO["t5"].hook_module
    assert (top["phase"], top["step"], top["site"]) == ("forward", 0, "harmful")
    assert [(s["op"].split(".")[1], s["site"]) for s in rep["sites"]] == [
        ("fill_", "harmful"), ("log", "absorbed"), ("log", "absorbed")]
