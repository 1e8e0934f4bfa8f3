"""Module records flag the precision their subtree computed in (``flags["compute_dtype"]``), and
compare judges such a module's float32 output at that precision."""

from __future__ import annotations

import json

import torch
from torch import nn

import torchparity
from torchparity.capture.compute_dtype import compute_dtype


class Upcast(nn.Module):
    """Inner ops in the parameters' dtype, output upcast to float32 (as HF does with logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.to(self.body[0].weight.dtype)).float()


def _dump(path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    net = Upcast().to(dtype)
    x = torch.randn(8, 64)
    with torchparity.dump(str(path), model=net, level="module"):
        net(x).sum().backward()


def _flags(path) -> dict[str, object]:
    out = {}
    for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["name"]] = (r.get("flags") or {}).get("compute_dtype")
    return out


def test_compute_dtype_of_params_and_autocast():
    lin = nn.Linear(4, 4)
    assert compute_dtype(lin) is None
    assert compute_dtype(nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16))) == "bfloat16"
    assert compute_dtype(nn.ReLU(), [torch.ones(1)]) is None
    if hasattr(torch, "get_autocast_dtype") or hasattr(torch, "get_autocast_cpu_dtype"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert compute_dtype(nn.Linear(4, 4)) == "bfloat16"


def test_module_records_carry_the_flag(tmp_path):
    _dump(tmp_path / "bf", torch.bfloat16)
    _dump(tmp_path / "fp", torch.float32)
    bf, fp = _flags(tmp_path / "bf"), _flags(tmp_path / "fp")
    assert bf["Module.Upcast.forward.0"] == "bfloat16" and bf["Module.body.2.Linear.backward.0"] == "bfloat16"
    assert set(fp.values()) == {None}  # float32: no flag, the records are as before


def test_fp32_output_of_a_bf16_module_is_judged_at_bf16(tmp_path):
    _dump(tmp_path / "bf", torch.bfloat16)
    _dump(tmp_path / "fp", torch.float32)
    res = torchparity.compare(str(tmp_path / "bf"), str(tmp_path / "fp"))
    r = res.rows
    root = r[(r["device_name"] == "Module.Upcast.forward.0") & (r["tensor"] == "output.0")]
    assert root["device_dtype"].iat[0] == "float32" and root["judge_dtype"].iat[0] == "bfloat16"
    assert res.root_cause is None and not res.diverged, res.summary.get("warnings")
