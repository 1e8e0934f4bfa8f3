"""Engine filters needed by the MetaX recorder façade: open/exclusive op_range, sequence names,
API families and single sequence names in ``ops``, ``skip=0``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchparity
from torchparity.dump.options import DumpOptions, api_family, compile_patterns, matches
from torchparity.errors import UsageError


def _run(tmp_path, sub="d", **opts):
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    a = torch.tensor([0.25])
    with torchparity.dump(str(tmp_path / sub), level="api", stack=False, **opts):
        y = torch.matmul(x, w)   # fwd 0
        y = torch.relu(y)        # fwd 1
        y = y.relu_()            # fwd 2
        y = F.relu6(y)           # fwd 3
        y = F.prelu(y, a)        # fwd 4
        y = torch.sigmoid(y)     # fwd 5
    df = torchparity.load_dump(str(tmp_path / sub))
    return df.drop_duplicates("record_id").sort_values("record_id")


def _seqs(df):
    return [f["seq_name"] for f in df["flags"]]


def test_seq_names_number_api_records_per_direction(tmp_path):
    df = _run(tmp_path, seq_names=True)
    assert _seqs(df) == ["torch.matmul.0.fwd", "torch.relu.1.fwd", "torch.Tensor.relu_.2.fwd",
                         "torch.nn.functional.relu6.3.fwd", "torch.prelu.4.fwd", "torch.sigmoid.5.fwd"]


def test_no_seq_name_flag_unless_asked(tmp_path):
    df = _run(tmp_path)
    assert not any(isinstance(f, dict) and "seq_name" in f for f in df["flags"])


@pytest.mark.parametrize("rng, end, expected", [
    ([None, "torch.relu6.3.fwd"], "inclusive", None),  # not a name of this run: open to the end
    ([None, "torch.nn.functional.relu6.3.fwd"], "exclusive", [0, 1, 2]),
    ([None, "torch.nn.functional.relu6.3.fwd"], "inclusive", [0, 1, 2, 3]),
    (["torch.relu.1.fwd", None], "exclusive", [1, 2, 3, 4, 5]),
    (["torch.relu.1.fwd", "torch.sigmoid.5.fwd"], "exclusive", [1, 2, 3, 4]),
    (["Torch.relu.0.forward", "Tensor.relu_.0.forward"], "inclusive", [1, 2]),  # torchparity names still work
])
def test_op_range_open_and_exclusive(tmp_path, rng, end, expected):
    df = _run(tmp_path, seq_names=True, op_range=rng, op_range_end=end)
    got = [int(s.split(".")[-2]) for s in _seqs(df)]
    assert got == (expected if expected is not None else [0, 1, 2, 3, 4, 5])


def test_family_pattern_matches_relu_apis_only(tmp_path):
    df = _run(tmp_path, seq_names=True, ops=["family:relu"])
    assert _seqs(df) == ["torch.relu.1.fwd", "torch.Tensor.relu_.2.fwd"]
    assert {api_family(n) for n in ("torch.relu", "relu_", "Tensor.relu", "ReLU", "torch.nn.functional.relu_")} == {"relu"}
    assert api_family("prelu") != "relu" and api_family("ReLU6") != "relu"
    assert matches(compile_patterns(["family:relu"]), "ReLU") and not matches(compile_patterns(["family:relu"]), "PReLU")


def test_seq_ops_select_single_ops_and_keep_numbering(tmp_path):
    df = _run(tmp_path, seq_names=True, ops=["seq:torch.sigmoid.5.fwd", "family:matmul"])
    assert _seqs(df) == ["torch.matmul.0.fwd", "torch.sigmoid.5.fwd"]


def test_skip_zero_and_one_record_every_op_skip_n_every_nth(tmp_path):
    assert len(_run(tmp_path, skip=0)) == 6
    assert _seqs(_run(tmp_path, "d2", skip=4, seq_names=True)) == ["torch.matmul.0.fwd", "torch.prelu.4.fwd"]


def test_bad_filter_options_are_usage_errors():
    with pytest.raises(UsageError):
        DumpOptions(skip=-1)
    with pytest.raises(UsageError):
        DumpOptions(op_range=["a"])
    with pytest.raises(UsageError):
        DumpOptions(op_range=["a", 3])
    with pytest.raises(UsageError):
        DumpOptions(op_range_end="open")


def test_unselected_ops_still_open_and_close_the_range(tmp_path):
    df = _run(tmp_path, seq_names=True, ops=["family:relu", "family:sigmoid"],
              op_range=["torch.matmul.0.fwd", "torch.sigmoid.5.fwd"], op_range_end="exclusive")
    assert _seqs(df) == ["torch.relu.1.fwd", "torch.Tensor.relu_.2.fwd"]
