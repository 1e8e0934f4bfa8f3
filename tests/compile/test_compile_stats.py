"""In-graph statistics: NaN and Inf counts and the moments, under both inner compilers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn

from torchparity.compile import compile_backend

pytestmark = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                                reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)")


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


@pytest.mark.parametrize("inner", ["eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not (shutil.which("gcc") or shutil.which("cc")), reason="Inductor needs a C++ compiler"))])
def test_nan_inf_counts_and_moments(tmp_path, inner):
    x = torch.arange(12, dtype=torch.float32)
    x[[1, 4, 7]] = float("nan")
    x[[2, 9]] = float("inf")
    x[5] = float("-inf")
    torch._dynamo.reset()
    cap = compile_backend(tmp_path / "d", inner=inner)
    torch.compile(Scale(), backend=cap)(x)
    cap.close()
    rec = json.loads((tmp_path / "d" / "step0" / "rank0" / "records.jsonl").read_text().splitlines()[0])
    st = rec["tensors"][0]["stats"]
    assert (st["nan"], st["inf"]) == (3, 3)
    finite = torch.arange(6, dtype=torch.float32) * 2  # a finite tensor: the moments themselves
    torch._dynamo.reset()
    cap = compile_backend(tmp_path / "e", inner=inner)
    torch.compile(Scale(), backend=cap)(torch.arange(6, dtype=torch.float32))
    cap.close()
    st = json.loads((tmp_path / "e" / "step0" / "rank0" / "records.jsonl").read_text().splitlines()[0])["tensors"][0]["stats"]
    assert st["max"] == 10 and st["min"] == 0 and st["mean"] == pytest.approx(5.0)
    assert st["norm"] == pytest.approx(float(finite.norm())) and st["nan"] == 0 and st["inf"] == 0
