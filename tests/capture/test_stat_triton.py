"""The one-pass Triton statistics kernel (capture/stat_triton.py) gives host_stats' values.

The cases are in triton_cases.py, run in a fresh process: on the CPU under Triton's interpreter
(TRITON_INTERPRET=1, Triton >= 3, which must be on before Triton is imported), and on a CUDA
machine compiled, on cuda. Without Triton these tests skip; the staging path that takes every
value then is tested by test_stat_batch.py either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.capture.rows import assert_stats_close as _close
import torch

triton = pytest.importorskip("triton")
if int(triton.__version__.split(".")[0]) < 3:  # pragma: no cover - the Triton of torch 2.1
    pytest.skip("Triton's interpreter needs Triton 3", allow_module_level=True)

# the interpreter is the CPU-only machine's stand-in for a GPU; where CUDA is, the kernel runs compiled
_DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(scope="module", params=_DEVICES)
def cases(request: pytest.FixtureRequest) -> dict[str, Any]:
    env = dict(os.environ)
    if request.param == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    script = Path(__file__).with_name("triton_cases.py")
    p = subprocess.run([sys.executable, str(script), request.param], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _all_close(case: dict[str, Any]) -> None:
    for row in case["rows"]:
        assert row["got"] is not None
        _close(row["got"], row["want"])


def test_the_kernel_is_used(cases: dict[str, Any]) -> None:
    assert cases["usable"]
    assert cases["random"]["triton_values"] == len(cases["random"]["rows"]) == 60
    assert cases["random"]["launches"] == 60  # one kernel per value (what bench_counts adds to the torch ops)


def test_rows_equal_host_stats(cases: dict[str, Any]) -> None:
    """Sizes around the block and past programs x block, three dtypes, NaN/Inf/huge/tiny values."""
    _all_close(cases["random"])


def test_masks_nan_and_inf(cases: dict[str, Any]) -> None:
    """finfo.min masks (squares past float32), all NaN, all -Inf, +-Inf, signed zeros, tiny values."""
    assert cases["special"]["triton_values"] == len(cases["special"]["rows"])
    _all_close(cases["special"])


def test_dense_permuted_values_take_the_kernel(cases: dict[str, Any]) -> None:
    """A transpose, channels_last, a permute: not contiguous, but their elements fill their memory
    densely, so the kernel reads them in memory order (statistics do not depend on the order)."""
    assert not any(cases["permuted_contiguous"])
    assert cases["permuted"]["triton_values"] == len(cases["permuted"]["rows"]) == 4
    _all_close(cases["permuted"])


def test_other_values_take_the_staging_path(cases: dict[str, Any]) -> None:
    assert cases["other"]["triton_values"] == 0
    _all_close(cases["other"])
    assert cases["asked_off"]["triton_values"] == 0  # StatBatcher(triton=False)
    _all_close(cases["asked_off"])


def test_a_value_overwritten_after_measure_keeps_its_statistics(cases: dict[str, Any]) -> None:
    assert cases["overwritten"][:3] == [5.0, 0.0, 2.5] and cases["overwritten"][4:] == [0.0, 0.0]


def test_partial_rows_past_the_limit_flush(cases: dict[str, Any]) -> None:
    """With room for two values' partial rows, the third of four values flushes the first two on
    its way in; the last two are flushed at the end: every value gets its row."""
    assert cases["limit"]["flushes"] == 2 and cases["limit"]["triton_values"] == 2
    assert [r["got"][0] for r in cases["limit"]["rows"]] == [0.0, 1.0, 2.0, 3.0]


def test_a_row_limit_below_one_value_flushes_each_value_alone(cases: dict[str, Any]) -> None:
    assert [r["got"][0] for r in cases["limit_below_one_value"]["rows"]] == [0.0, 1.0, 2.0]
    assert cases["limit_below_one_value"]["flushes"] == 3


def test_flush_kernels_do_not_grow_with_values(cases: dict[str, Any]) -> None:
    few, many = cases["flush_kernels"]
    assert few == many <= 20, (few, many)


def test_direct_launch_gives_the_same_rows(cases: dict[str, Any]) -> None:
    """On CUDA the compiled kernel is launched directly after its first launch (where the installed
    Triton launches the same way); its rows equal those of Triton's own launch path."""
    d = cases["direct_launch"]
    assert d["used"] == d["available"]
    assert d["same_rows"]


def test_a_kernel_that_fails_leaves_the_staging_path(cases: dict[str, Any]) -> None:
    """Where Triton cannot compile or launch (no C compiler in a training image), the statistics
    are still taken, by the staging path, and the user's step goes on."""
    assert cases["broken"]["triton_values"] == 0
    _all_close(cases["broken"])


def test_many_values_one_launch_per_dtype(cases: dict[str, Any]) -> None:
    """add_many (a compiled graph's values): the kernel's values of each dtype in ONE launch, the
    others staged; every row equals host_stats', in the order given, and again on a second run
    (the chunk table reused)."""
    many = cases["many"]
    n_kernel = 60 + 8 + 4  # random, special, permuted values; other_values are staged
    assert many["triton_values"] == n_kernel
    # one launch per dtype and alignment class (16-byte loads where address and size allow)
    assert 3 <= many["launches"] == many["classes"] <= 6
    _all_close(many)
    assert json.dumps(many["again"]) == json.dumps([r["got"] for r in many["rows"]])  # NaN rows too


def test_many_values_past_the_row_limit_are_split(cases: dict[str, Any]) -> None:
    """Five values where the partial rows hold two: split into launches, flushed between, none lost."""
    case = cases["many_limit"]
    _all_close(case)
    assert [r["got"][0] for r in case["rows"]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert case["flushes"] >= 3


def test_many_values_when_the_kernel_fails(cases: dict[str, Any]) -> None:
    """The kernel fails (no C compiler for Triton's launcher): tried once for the device, not once
    per dtype, and every value measured on the staging path."""
    case = cases["many_broken"]
    assert case["triton_values"] == 0
    assert len(case["tries"]) == 1, case["tries"]
    _all_close(case)
