"""fp16 autocast against fp32 at the api and aten levels: api records carry autocast's compute
dtype (and are judged at it), and the matcher pairs calls that the two runs ran in another order
(autograd's gradient accumulations, parameter gradients) by what they are, not by their counter."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

import torchparity
from torchparity.capture.compute_dtype import call_flags
from torchparity.compare.matching import match_records
from torchparity.compat.amp import backward_and_step

pytestmark = pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch.amp.GradScaler needs torch >= 2.3")


class GruLM(nn.Module):
    """A GRU under autocast computes in float16 while its API call reads and returns float32."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(x)
        return self.head(h)


def _run(path, level: str, amp: bool) -> list[float]:
    torch.manual_seed(0)
    net = GruLM()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if amp else None
    torch.manual_seed(1)
    x, y = torch.randn(2, 5, 8), torch.randint(0, 4, (10,))
    losses = []
    with torchparity.dump(str(path), model=net, level=level):
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            loss = nn.functional.cross_entropy(net(x).float().reshape(-1, 4), y)
        losses.append(loss.item())
        backward_and_step(loss, opt, scaler)
    return losses


def _flags(path) -> dict[str, object]:
    out = {}
    for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["name"]] = (r.get("flags") or {}).get("compute_dtype")
    return out


def test_call_flags_only_under_autocast():
    x = torch.ones(2)
    assert call_flags((x,), {}) is None
    with torch.autocast("cpu", dtype=torch.float16):
        assert call_flags((x, [x]), {}) == {"compute_dtype": "float16"}
        assert call_flags(([x],), {}) == {"compute_dtype": "float16"}  # a list of tensors (torch.gru's params)
        assert call_flags((3,), {"size": 2}) is None  # no tensor argument: a factory, autocast does not apply
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert call_flags((x,), {}) == {"compute_dtype": "bfloat16"}


@pytest.mark.parametrize("level", ["api", "mix"])
def test_api_records_carry_autocast_compute_dtype(tmp_path, level):
    _run(tmp_path / "amp", level, amp=True)
    _run(tmp_path / "fp", level, amp=False)
    amp, fp = _flags(tmp_path / "amp"), _flags(tmp_path / "fp")
    assert amp["Torch.gru.0.forward"] == "float16"
    assert amp["Functional.linear.0.forward"] == "float16"
    assert amp["Functional.linear.0.backward"] == "float16"  # the backward gets its forward's
    assert amp.get("Tensor.mul.0.forward") is None  # scaler.scale(loss): outside autocast
    assert set(fp.values()) == {None}  # float32 run: no flag, records as before
    raw = (tmp_path / "fp" / "step0" / "rank0" / "records.jsonl").read_text()
    assert "compute_dtype" not in raw


@pytest.mark.parametrize("level", ["api", "aten", "mix"])
def test_gru_fp16_autocast_vs_fp32_is_clean(tmp_path, level):
    """Before: api/mix blamed ``torch.gru`` ("amplified 209x", judged at float32); aten paired
    the GRU backward's gradient-accumulation ``add`` calls crosswise ((48, 16) with (2, 16))."""
    _run(tmp_path / "dev", level, amp=True)
    _run(tmp_path / "bench", level, amp=False)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), step=0)
    assert res.root_cause is None, res.root_cause.reason
    assert not res.diverged
    r = res.rows
    paired = r[(r["match"] != "unmatched") & (r["kind"] == "tensor")]
    assert len(paired) and (paired["device_shape"].astype(str) == paired["bench_shape"].astype(str)).all()
    if level != "aten":
        gru = r[(r["device_name"] == "Torch.gru.0.forward") & (r["io"] == "output")]
        assert (gru["judge_dtype"] == "float16").all()


# ---- the matcher, on synthetic records -----------------------------------------------------------

def _rows(recs: list[tuple[str, str, str, str, list[tuple[str, str, tuple]]]]) -> pd.DataFrame:
    """Tensor rows for records (name, op, phase, module, [(io, arg, shape)]); call indices per
    (module, op, phase) as the capture numbers them."""
    out, counts = [], {}
    for rid, (name, op, phase, module, tensors) in enumerate(recs):
        ci = counts.get((module, op, phase), 0)
        counts[(module, op, phase)] = ci + 1
        for io, arg, shape in tensors:
            out.append({"record_id": rid, "name": name, "phase": phase, "module": module, "op": op,
                        "call_index": ci, "level": "aten", "io": io, "arg": arg, "kind": "tensor",
                        "dtype": "float32", "shape": shape})
    return pd.DataFrame(out)


def _pairs(dev: pd.DataFrame, bench: pd.DataFrame) -> dict[str, str]:
    m = match_records(dev, bench)
    dn = dev.drop_duplicates("record_id").set_index("record_id")["name"]
    bn = bench.drop_duplicates("record_id").set_index("record_id")["name"]
    return {dn[x]: bn[y] for x, y in zip(m["dev_rid"], m["bench_rid"]) if x >= 0 and y >= 0}


def _add(name: str, shape: tuple) -> tuple:
    return (name, "aten.add.Tensor", "backward", "rnn",
            [("input", "0", shape), ("input", "1", shape), ("output", "0", shape)])


def test_reordered_calls_pair_by_shape_not_by_counter():
    big, small = (48, 16), (2, 16)
    dev = _rows([_add("d0", big), _add("d1", small), _add("d2", big), _add("d3", small)])
    bench = _rows([_add("b0", small), _add("b1", big), _add("b2", small), _add("b3", big)])
    assert _pairs(dev, bench) == {"d0": "b1", "d1": "b0", "d2": "b3", "d3": "b2"}


def test_another_model_size_still_pairs_by_counter():
    # no common shape at all: the calls are paired as before, so compare can refuse the dumps
    dev = _rows([_add("d0", (4, 4)), _add("d1", (8, 4))])
    bench = _rows([_add("b0", (4, 5)), _add("b1", (8, 5))])
    assert _pairs(dev, bench) == {"d0": "b0", "d1": "b1"}


def _grad(module: str, param: str, n: int, shape: tuple) -> tuple:
    return (f"Grad.{module}.{param}.{n}.backward", "parameters_grad", "backward", module, [("grad", param, shape)])


def test_parameter_gradients_pair_by_parameter():
    # a LayerNorm's weight and bias gradients have the same shape: only the name tells them apart
    dev = _rows([_grad("norm", "bias", 0, (8,)), _grad("norm", "weight", 0, (8,)),
                 _grad("head", "bias", 0, (4,)), _grad("head", "weight", 0, (4, 8))])
    bench = _rows([_grad("norm", "weight", 0, (8,)), _grad("norm", "bias", 0, (8,)),
                   _grad("head", "weight", 0, (4, 8)), _grad("head", "bias", 0, (4,))])
    got = _pairs(dev, bench)
    assert got == {n: n for n in ("Grad.norm.bias.0.backward", "Grad.norm.weight.0.backward",
                                  "Grad.head.bias.0.backward", "Grad.head.weight.0.backward")}
