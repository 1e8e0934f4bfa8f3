"""Sentinel constants, saturation and workspaces in the offline compare.

A clean bf16 run compared with its fp32 reference must not be judged diverged because of values
that mean the same thing in both dtypes: ``finfo(dtype).min`` mask constants (as scalar arguments
and inside tensors) and a kernel's scratch workspace (``mkldnn_rnn_layer``'s output 3, whose size
depends on the dtype). A genuine saturation and a genuinely different argument stay errors.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.compare._testing import SyntheticDump
from torchparity.compare.integrity import NOT_A_VALUE, NOT_COMPARED
from torchparity.compare.rows import _same_value
from torchparity.records import TensorEntry

BF16_MIN = torch.finfo(torch.bfloat16).min
F32_MIN = torch.finfo(torch.float32).min


def _masked_attention(root: Path, dt: torch.dtype, cast: bool) -> Path:
    """``where(mask, 0, finfo(dt).min)`` -> scores + mask -> (bf16: cast to float32) -> softmax."""
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(2, 4, 8, 8, generator=g) * 0.1).to(dt)
    mask = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8)
    d = SyntheticDump(root)
    fill = torch.finfo(dt).min
    m_t = torch.where(mask, torch.zeros((), dtype=dt), torch.tensor(fill, dtype=dt))
    (m_ref,) = d.op("aten.where.ScalarSelf", "model", [(mask, None), (0.0, None), (fill, None)], [m_t])
    added = scores + m_t
    (a_ref,) = d.op("aten.add.Tensor", "model.layers.0.self_attn", [(scores, None), (m_t, m_ref)], [added])
    x, x_ref = added, a_ref
    if cast:  # the bf16 run's .to(float32) before the softmax: a no-op (no record) in float32
        x = added.float()
        (x_ref,) = d.op("aten._to_copy.default", "model.layers.0.self_attn", [(added, a_ref)], [x])
    d.op("aten._softmax.default", "model.layers.0.self_attn", [(x, x_ref), (-1, None), (False, None)],
         [torch.softmax(x.float(), -1)])
    return d.close()


def test_finfo_min_masks_are_the_same_sentinel_in_both_dtypes(tmp_path: Path) -> None:
    dev = _masked_attention(tmp_path / "dev", torch.bfloat16, cast=True)
    bench = _masked_attention(tmp_path / "bench", torch.float32, cast=False)
    res = torchparity.compare(str(dev), str(bench))
    rows = res.rows
    errors = rows[rows["verdict"] == "error"]
    assert errors.empty, errors[["device_name", "tensor", "reason"]].to_string()
    assert res.root_cause is None and not res.diverged
    # the scalar argument: -3.39e38 (bf16) vs -3.40e38 (fp32) is one value by meaning
    arg = rows[(rows["device_name"] == "Aten.where.0.forward") & (rows["tensor"] == "input.2")].iloc[0]
    assert arg["device_value"] == BF16_MIN and arg["bench_value"] == F32_MIN and not arg["value_differs"]
    # the mask tensor: sentinel minima, judged on the other statistics (its max, 0 = 0), never inf
    mt = rows[(rows["device_name"] == "Aten.where.0.forward") & (rows["tensor"] == "output.0")].iloc[0]
    assert mt["min_sentinel"] and not mt["max_sentinel"] and mt["min_diff"] == 0
    assert mt["stat_error"] == 0 and not mt["nonfinite_mismatch"]
    # scores + mask: the error comes from the ordinary extreme (bf16 rounding), not from the sentinel
    add = rows[(rows["device_name"] == "Aten.add.0.forward") & (rows["tensor"] == "output.0")].iloc[0]
    assert add["min_sentinel"] and 0 < add["stat_error"] < 0.01
    # the device-only cast's input carries the sentinel of its producer (add's output)
    cast = rows[(rows["device_name"] == "Aten._to_copy.0.forward") & (rows["tensor"] == "input.0")].iloc[0]
    assert cast["match"] == "unmatched" and cast["min_sentinel"]


def _one_op(root: Path, out: torch.Tensor) -> Path:
    d = SyntheticDump(root)
    x = torch.ones(4, dtype=out.dtype)
    d.op("aten.mul.Tensor", "layer", [(x, None), (x, None)], [out])
    return d.close()


def test_genuine_saturation_is_still_an_error(tmp_path: Path) -> None:
    """The device saturates at bf16's max where the bench holds an ordinary value: no sentinel."""
    dev = _one_op(tmp_path / "dev", torch.tensor([1.0, torch.finfo(torch.bfloat16).max, 2.0, 3.0],
                                                 dtype=torch.bfloat16))
    bench = _one_op(tmp_path / "bench", torch.tensor([1.0, 3.388e38, 2.0, 3.0]))  # within bf16 rounding
    rows = torchparity.compare(str(dev), str(bench)).rows
    out = rows[rows["tensor"] == "output.0"].iloc[0]
    assert not out["max_sentinel"] and not out["min_sentinel"]
    assert out["verdict"] == "error" and "saturated" in out["reason"]


def test_sentinel_on_one_side_only_is_a_difference(tmp_path: Path) -> None:
    """A mask present in the device run only (bench max ordinary): the extreme is compared."""
    dev = _one_op(tmp_path / "dev", torch.tensor([1.0, BF16_MIN, 2.0, 3.0], dtype=torch.bfloat16))
    bench = _one_op(tmp_path / "bench", torch.tensor([1.0, -1.0, 2.0, 3.0]))
    rows = torchparity.compare(str(dev), str(bench)).rows
    out = rows[rows["tensor"] == "output.0"].iloc[0]
    assert not out["min_sentinel"] and out["verdict"] == "error" and out["stat_error"] > 1


@pytest.mark.parametrize("a, b, d_dt, b_dt, same", [
    (BF16_MIN, F32_MIN, "bfloat16", "float32", True),  # finfo.min of each dtype
    (-BF16_MIN, -F32_MIN, "bfloat16", "float32", True),  # finfo.max of each dtype
    ("-inf", F32_MIN, "bfloat16", "float32", True),  # -inf is a sentinel too (written as text)
    (BF16_MIN, -F32_MIN, "bfloat16", "float32", False),  # opposite signs
    # a narrower dtype's sentinel in a float32 record (autocast builds masks from finfo(float16).min)
    (BF16_MIN, F32_MIN, "float32", "float32", True),
    (-65504.0, F32_MIN, "float32", "float32", True),
    (-65000.0, F32_MIN, "float32", "float32", False),  # an ordinary value is not a sentinel
    (BF16_MIN, -1e30, "bfloat16", "float32", False),  # an ordinary value on the bench side
    (float(torch.tensor(1 / math.sqrt(24), dtype=torch.bfloat16)), 1 / math.sqrt(24), "bfloat16", "float32", True),
    (0.2041, 0.2042, "float32", "float32", False),  # fp32 vs fp32: exact
    (0.2041, 0.2042, "float32", "bfloat16", False),  # the device is the finer one: exact
    (0.5, 0.6, "bfloat16", "float32", False),  # beyond one bf16 ulp
    (2, 3, "bfloat16", "float32", False),  # ints exact
    (True, False, "bfloat16", "float32", False),  # bools exact
    (True, 1.0, "bfloat16", "float32", False),
    ("tanh", "none", "bfloat16", "float32", False),  # approximate='tanh' vs 'none'
    ("torch.bfloat16", "torch.float32", "bfloat16", "float32", True),  # dtype arguments
    ("nan", "nan", "bfloat16", "float32", True),
])
def test_scalar_arguments(a: object, b: object, d_dt: str, b_dt: str, same: bool) -> None:
    assert _same_value(a, b, d_dt, b_dt) is same


def _rnn(root: Path, dt: torch.dtype, ws_size: int, measured_ws: bool = False) -> Path:
    """One ``mkldnn_rnn_layer`` whose output 3 is oneDNN's workspace (size depends on the dtype),
    described but not measured by the capture, then a consumer of its output 0."""
    d = SyntheticDump(root)
    x = torch.linspace(-1, 1, 24).reshape(2, 3, 4).to(dt)
    h = torch.tanh(x)
    refs = d.op("aten.mkldnn_rnn_layer.default", "rnn", [(x, None)], [h])
    rec = d.records[-1]
    ws = TensorEntry(io="output", arg="3", dtype="uint8", shape=[ws_size], stride=[1], device="cpu",
                     requires_grad=False)
    if measured_ws:
        ws.stats = {"max": 255.0, "min": 0.0, "mean": 100.0, "norm": 1e4, "nan": 0, "inf": 0}
    rec.tensors.append(ws)
    d.op("aten.mul.Tensor", "proj", [(h, refs[0]), (h, refs[0])], [h * h])
    return d.close()


def test_described_not_measured_workspace_is_never_compared(tmp_path: Path) -> None:
    dev = _rnn(tmp_path / "dev", torch.bfloat16, 69632)
    bench = _rnn(tmp_path / "bench", torch.float32, 86016)
    res = torchparity.compare(str(dev), str(bench))
    rows = res.rows
    ws = rows[rows["tensor"] == "output.3"].iloc[0]
    assert ws["verdict"] == "skip" and ws["reason"] == NOT_A_VALUE
    assert (rows["verdict"] != "error").all(), rows[rows["verdict"] == "error"][["tensor", "reason"]]
    assert res.summary["complete"] and res.summary["n_not_compared"] == 0 and not res.diverged


def test_measured_on_one_side_only_is_still_not_compared(tmp_path: Path) -> None:
    """Statistics missing on one side (a damaged or foreign dump) are no workspace: damage."""
    dev = _rnn(tmp_path / "dev", torch.float32, 100)
    bench = _rnn(tmp_path / "bench", torch.float32, 100, measured_ws=True)
    rows = torchparity.compare(str(dev), str(bench), allow_partial=True).rows
    ws = rows[rows["tensor"] == "output.3"].iloc[0]
    assert ws["verdict"] == "skip" and str(ws["reason"]).startswith(NOT_COMPARED)


def test_autocast_fp16_mask_plus_a_bias_in_float32_is_the_sentinel(tmp_path: Path) -> None:
    """T5 under fp16 autocast: a float32 add of a position bias and finfo(float16).min gives
    -65506.5 where the fp32 run's finfo(float32).min absorbs the bias: the same mask."""
    dev = _one_op(tmp_path / "dev", torch.tensor([1.0, -65504.0 - 2.46, 2.0, 3.0]))
    bench = _one_op(tmp_path / "bench", torch.tensor([1.0, F32_MIN, 2.0, 3.0]))
    rows = torchparity.compare(str(dev), str(bench)).rows
    out = rows[rows["tensor"] == "output.0"].iloc[0]
    assert out["min_sentinel"] and out["verdict"] != "error"
    # an ordinary value against the sentinel stays a difference
    dev2 = _one_op(tmp_path / "dev2", torch.tensor([1.0, -1000.0, 2.0, 3.0]))
    rows2 = torchparity.compare(str(dev2), str(bench)).rows
    assert not rows2[rows2["tensor"] == "output.0"].iloc[0]["min_sentinel"]


def test_device_only_cast_of_an_fp16_mask_is_no_saturation(tmp_path: Path) -> None:
    """Under fp16 autocast a device-only ``_to_copy`` outputs exactly finfo(float16).min (the
    mask): with no bench record to pair, an exact dtype max is a sentinel, not an overflow."""
    x = torch.tensor([0.0, -65504.0, 1.0, 2.0])
    sides = []
    for side in ("dev", "bench"):
        d = SyntheticDump(tmp_path / side)
        src = d.op("aten.mul.Tensor", "layer", [(x, None), (x, None)], [x])
        if side == "dev":
            d.op("aten._to_copy.default", "layer", [(x, src[0])], [x.to(torch.float16)])
        d.op("aten.add.Tensor", "layer", [(x, src[0]), (x, None)], [x + x])
        sides.append(str(d.close()))
    res = torchparity.compare(*sides)
    rows = res.rows
    cast = rows[rows["device_name"].str.startswith("Aten._to_copy")]
    assert len(cast) and (cast["verdict"] != "error").all(), cast[["tensor", "verdict", "reason"]].to_string()
    # a NaN there still is one
    y = torch.tensor([0.0, float("nan"), 1.0, 2.0])
    d = SyntheticDump(tmp_path / "dev2")
    src = d.op("aten.mul.Tensor", "layer", [(x, None), (x, None)], [x])
    d.op("aten._to_copy.default", "layer", [(x, src[0])], [y.to(torch.float16)])
    d.op("aten.add.Tensor", "layer", [(x, src[0]), (x, None)], [x + x])
    rows2 = torchparity.compare(str(d.close()), sides[1]).rows
    assert (rows2[rows2["device_name"].str.startswith("Aten._to_copy")]["verdict"] == "error").any()
