"""Comparing statistics rows ``[max, min, mean, norm, nan, inf]`` in the capture tests."""

from __future__ import annotations

import math

import pytest


def assert_stats_close(got: list[float], want: list[float]) -> None:
    """Non-finite values equal (NaN with NaN), finite ones to float32 accumulation, counts exact."""
    assert len(got) == len(want) == 6
    for i, (g, w) in enumerate(zip(got, want)):
        if math.isnan(w) or math.isinf(w):
            assert (math.isnan(g) and math.isnan(w)) or g == w, (i, got, want)
        else:
            assert g == pytest.approx(w, rel=2e-5, abs=1e-30 + 2e-5 * abs(want[3])), (i, got, want)
    assert got[4] == want[4] and got[5] == want[5]  # counts are exact
