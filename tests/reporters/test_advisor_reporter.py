"""The advisor: names the root cause with its numbers, gives op-family advice, never says OK next to errors."""

from __future__ import annotations

import dataclasses

import pytest

from torchparity.plugins import get_registry
from torchparity.results import CompareResult, Suspect
from torchparity_reporter_advisor import AdvisorReporter, advise, family_of, op_base


def _text(result: CompareResult, tmp_path) -> str:
    (path,) = AdvisorReporter().write(result, tmp_path / "out")
    assert path.name == "advisor.txt"
    text = path.read_text(encoding="utf-8")
    assert text == advise(result)
    return text


def test_registered_as_plugin():
    assert "advisor" in get_registry().reporters


def test_matmul_root_cause(compare_result, tmp_path):
    text = _text(compare_result, tmp_path)
    rc = compare_result.root_cause
    assert text.startswith("torchparity advisor")
    assert "DIVERGED" in text
    assert f"Root cause: {rc.name} ({rc.op}) in module 'layers.1.mlp.fc1', step 0, rank 0, forward" in text.replace("\n", " ")
    # why: the numbers
    assert "1.1e-07" in text and "0.0032" in text and "x2.91e+04" in text
    assert "float16" in text and "eps" in text
    # op-family advice for matmuls: precision modes on every vendor
    for s in ("allow_tf32", "allow_bf16_reduced_precision_reduction", "set_float32_matmul_precision",
              "allow_hf32", "ACL_PRECISION_MODE", "must_keep_origin_dtype", "mudnn.allow_tf32"):
        assert s in text, s
    assert "non-determinism" in text
    assert "torchparity replay" in text
    assert "All data" not in text and "No divergence" not in text
    assert "Aten.mul.0.forward" in text  # the unmatched record is named


def test_layer_norm_root_cause(make_result, tmp_path):
    text = _text(make_result("layer_norm"), tmp_path)
    assert "layers.0.input_layernorm" in text
    assert "eps" in text and "1e-5 vs 1e-6" in text and "float32" in text
    assert "allow_tf32" not in text


def _with_root(result: CompareResult, op: str, phase: str = "forward") -> CompareResult:
    rc = dataclasses.replace(result.root_cause, op=op, phase=phase)
    return dataclasses.replace(result, root_cause=rc, suspects=[rc])


@pytest.mark.parametrize("op, must", [
    ("aten._softmax.default", ["dtype=torch.float32", "finfo"]),
    ("torch.nn.functional.scaled_dot_product_attention", ["SDPBackend.MATH"]),
    ("aten.convolution.default", ["cudnn.allow_tf32", "conv.allow_hf32", "ACL_PRECISION_MODE"]),
    ("aten.index_add.default", ["use_deterministic_algorithms", "CUBLAS_WORKSPACE_CONFIG", "itself"]),
    ("aten.native_dropout.default", ["manual_seed"]),
    ("aten.exp.default", ["65504"]),
    ("aten.all_reduce.default", ["NCCL_ALGO", "HCCL_DETERMINISTIC"]),
])
def test_family_advice(compare_result, tmp_path, op, must):
    text = _text(_with_root(compare_result, op), tmp_path)
    for s in must:
        assert s in text, (op, s)


def test_backward_root_cause(compare_result, tmp_path):
    text = _text(_with_root(compare_result, "aten.native_layer_norm_backward.default", "backward"), tmp_path)
    assert "backward computation" in text and "eps" in text


def test_op_base_and_family():
    assert op_base("aten.mm.default") == ("mm", False)
    assert op_base("torch.nn.functional.linear") == ("linear", False)
    assert op_base("aten.native_layer_norm_backward.default") == ("native_layer_norm", True)
    assert op_base("", "Tensor.__matmul__.0.forward") == ("matmul", False)
    assert family_of("aten.bmm.default").key == "matmul"
    assert family_of("aten.native_layer_norm.default").key == "norm"
    assert family_of("aten._log_softmax.default").key == "softmax"
    assert family_of("aten.frobnicate.default") is None


def test_unknown_op_gets_generic_advice(compare_result, tmp_path):
    text = _text(_with_root(compare_result, "aten.frobnicate.default"), tmp_path)
    assert "Re-run the op alone" in text and "torchparity replay" in text


def test_agreeing_result(agreeing, tmp_path):
    text = _text(agreeing, tmp_path)
    assert "No divergence" in text
    assert "DIVERGED" not in text and "NOT OK" not in text
    assert "What to try next" not in text and "Reproduce" not in text


def test_errors_without_root_cause_never_ok(make_result, tmp_path):
    text = _text(make_result("matmul", errors_without_root=True), tmp_path)
    assert "NOT OK" in text
    assert "No divergence" not in text and "agree" not in text
    assert "Aten.gelu.0.forward.output.0" in text  # the error rows are listed
    assert "What to try next" in text and "gelu" in text


def test_nothing_compared(empty, tmp_path):
    text = _text(empty, tmp_path)
    assert "NOTHING COMPARED" in text and "No divergence" not in text


def test_replay_case_from_summary(compare_result, tmp_path):
    res = dataclasses.replace(compare_result, summary=dict(compare_result.summary,
                                                           replay_cases={compare_result.root_cause.name: "cases/mm_6"}))
    assert "torchparity replay cases/mm_6" in _text(res, tmp_path)


def test_parameter_root_cause(compare_result, tmp_path):
    rc = dataclasses.replace(compare_result.root_cause, kind="parameter", name="Module.layers.1.mlp.fc1.weight")
    text = _text(dataclasses.replace(compare_result, root_cause=rc, suspects=[]), tmp_path)
    assert "parameter itself differs" in text and "checkpoint" in text


def test_nan_and_inf_values(compare_result, tmp_path):
    rc = dataclasses.replace(compare_result.root_cause, score=float("inf"), input_error=0.0,
                             output_error=float("nan"))
    rows = compare_result.rows.copy()
    rows.loc[rows["device_name"] == rc.name, ["rel_l2", "cosine"]] = [float("nan"), float("-inf")]
    text = _text(CompareResult(rows=rows, summary=compare_result.summary, root_cause=rc, suspects=[rc]), tmp_path)
    assert "NaN" in text and "inf" in text


def test_real_compare(real_compare, tmp_path):
    text = _text(real_compare, tmp_path)
    rc = real_compare.root_cause
    assert rc.name == "Aten.gelu.1.forward"
    assert "Root cause: Aten.gelu.1.forward (aten.gelu.default) in module 'layers.1.act'" in text
    assert "First divergent row: Aten.gelu.1.forward (aten.gelu.default) in module 'layers.1.act'" in text.replace("\n", " ")
    assert "approximate" in text  # activation advice
    assert "Aten.clone.0.forward" in text  # the extra op
