"""Issue 13 item 1: text columns with missing values (pandas >= 3 keeps them as NaN in
``astype(str)``) never crash matching: a renamed module, module- vs aten-level dumps, a bf16 dump
with casts against its fp32 benchmark."""

from __future__ import annotations

import pandas as pd
import torch

from torchparity.compare._testing import mlp_stack_dump, run_cli


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "TypeError" not in text, text


def test_text_column_missing_values_are_text() -> None:
    from torchparity.compare.matching import text_column

    s = pd.Series([None, float("nan"), (2, 3), "x", ["a", "b"]], dtype=object)
    assert text_column(s, missing="-").tolist() == ["-", "-", "(2, 3)", "x", "['a', 'b']"]
    assert text_column(pd.Series(["a", None], dtype=object)).tolist() == ["a", ""]


def test_signatures_of_records_with_scalar_arguments() -> None:
    from torchparity.compare.matching import _signatures

    rows = pd.DataFrame({"record_id": [0, 0, 0], "io": ["input", "input", "output"],
                         "shape": [(2, 3), None, (2, 3)]})
    assert _signatures(rows, [0]) == {0: "input:(2, 3)|input:-|output:(2, 3)"}


def test_mapping_that_renames_a_module(dumps, tmp_path) -> None:
    aten = dumps("aten", "statistics")
    m = tmp_path / "map.yaml"
    m.write_text("down_proj: down_projX\n")
    code, text = run_cli(["compare", str(aten), str(aten), "--mapping", str(m)])
    _no_traceback(text)
    assert code == 0 and "the runs agree" in text, text


def test_module_level_against_aten_level_is_a_one_line_error(dumps) -> None:
    code, text = run_cli(["compare", str(dumps("module", "statistics")), str(dumps("aten", "statistics"))])
    _no_traceback(text)
    assert code == 2, text
    assert [ln for ln in text.splitlines() if ln.startswith("torchparity: error:")] == [
        ln for ln in text.splitlines() if "do not record the same computation" in ln]


def test_mix_level_against_aten_level_compares(dumps) -> None:
    code, text = run_cli(["compare", str(dumps("mix", "statistics")), str(dumps("aten", "statistics"))])
    _no_traceback(text)
    assert code in (0, 1) and "compared " in text, text
    assert "the dumps differ in level" in text


def test_bf16_with_casts_against_fp32(tmp_path) -> None:
    dev = mlp_stack_dump(tmp_path / "bf16", dtype=torch.bfloat16, casts=2)
    bench = mlp_stack_dump(tmp_path / "fp32", casts=1)
    code, text = run_cli(["compare", str(dev), str(bench)])
    _no_traceback(text)
    assert code == 0, text
    assert "9 device-only" in text  # one extra cast per layer: input, scalar dtype, output
