"""Metrics in float64: safe for 0-d, one-element, all-zero, empty and non-finite tensors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from torchparity.compare.metrics import stat_metrics, tensor_metrics


@pytest.mark.parametrize("a,b", [
    (torch.tensor(2.0), torch.tensor(2.0)),
    (torch.tensor([3.0]), torch.tensor([3.0])),
    (torch.zeros(4, 4), torch.zeros(4, 4)),
    (torch.empty(0, 3), torch.empty(0, 3)),
    (torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([1.0, float("nan"), float("inf")])),
])
def test_equal_tensors_are_perfect_without_warnings(a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = tensor_metrics(a, b)
    assert m["cosine"] == 1.0 and m["max_abs_err"] == 0.0 and m["rel_l2"] == 0.0
    assert m["one_thousandth_ratio"] == 1.0 and not m["nonfinite_mismatch"]


def test_zero_vs_nonzero_and_nan_mismatch():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = tensor_metrics(torch.zeros(3), torch.ones(3))
        n = tensor_metrics(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))
    assert m["cosine"] == 0.0 and m["rel_l2"] == 1.0 and m["max_abs_err"] == 1.0
    assert n["nonfinite_mismatch"] and n["worst_index"] == [1] and math.isinf(n["rel_l2"])


def test_known_values():
    d = torch.tensor([[1.0, 2.0], [3.0, 4.004]], dtype=torch.bfloat16).float()
    b = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = tensor_metrics(torch.tensor([[1.0, 2.0], [3.0, 4.01]]), b)
    assert m["worst_index"] == [1, 1]
    assert m["max_abs_err"] == pytest.approx(0.01, rel=1e-4)
    assert m["max_rel_err"] == pytest.approx(0.0025, rel=1e-4)
    assert m["five_thousandth_ratio"] == 1.0 and m["one_thousandth_ratio"] == 0.75
    assert tensor_metrics(d, b)["cosine"] == pytest.approx(1.0)


def test_stat_metrics_vectorised_and_nonfinite():
    # rows: equal; 1% norm difference; masked -inf on both sides (max informative); NaN on one side;
    # all-NaN on the device only (its statistics are NaN but its NaN count is known)
    nan, inf = math.nan, math.inf
    d = {"max": [1, 1, 2.2, nan, nan], "min": [-1, -1, -inf, nan, nan], "mean": [0, 0, -inf, nan, nan],
         "norm": [5, 5.05, inf, nan, nan], "nan": [0, 0, 0, 1, 16], "inf": [0, 0, 4, 0, 0]}
    b = {"max": [1, 1, 2.0, 1, 1], "min": [-1, -1, -inf, -1, -1], "mean": [0, 0, -inf, 0, 0],
         "norm": [5, 5, inf, 5, 5], "nan": [0, 0, 0, 0, 0], "inf": [0, 0, 4, 0, 0]}
    d = {k: np.array(v, dtype="float64") for k, v in d.items()}
    b = {k: np.array(v, dtype="float64") for k, v in b.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = stat_metrics(d, b, np.array([16.0] * 5))
    err = out["stat_error"]
    assert err[0] == 0.0
    assert err[1] == pytest.approx(0.01)
    assert err[2] == pytest.approx(0.1)  # from the max alone
    assert math.isinf(err[3]) and math.isinf(err[4])
    assert out["nonfinite_mismatch"].tolist() == [False, False, False, True, True]
