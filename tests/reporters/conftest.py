"""A realistic synthetic CompareResult for the reporter tests.

It imitates an aten-level tensor-mode compare of a 2-layer transformer block stack (forward and a
little backward) where one op diverges: either ``layers.1.mlp.fc1``'s ``aten.mm`` (a
reduced-precision matmul) or ``layers.0.input_layernorm``'s ``aten.native_layer_norm``. Before the
root cause every tensor matches to ~1e-7; the root cause's output is off by ~3e-3 and the error
propagates downstream (warnings, then errors). The device dump also has one extra op
(``aten.mul``) with no benchmark counterpart (unmatched rows), one row has ``max_rel_err`` = inf
(bench value 0), and one has NaN statistics on the device side.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

from torchparity.results import CompareResult, Suspect

# (base name, op, module, inputs)  -- execution order of one forward pass
OPS: list[tuple[str, str, str, int]] = [
    ("embedding", "aten.embedding.default", "embed", 2),
]
for _layer in range(2):
    OPS += [
        ("native_layer_norm", "aten.native_layer_norm.default", f"layers.{_layer}.input_layernorm", 3),
        ("mm", "aten.mm.default", f"layers.{_layer}.self_attn.qkv", 2),
        ("bmm", "aten.bmm.default", f"layers.{_layer}.self_attn", 2),
        ("_softmax", "aten._softmax.default", f"layers.{_layer}.self_attn", 1),
        ("bmm", "aten.bmm.default", f"layers.{_layer}.self_attn", 2),
        ("mm", "aten.mm.default", f"layers.{_layer}.self_attn.o_proj", 2),
        ("add", "aten.add.Tensor", f"layers.{_layer}", 2),
        ("native_layer_norm", "aten.native_layer_norm.default", f"layers.{_layer}.post_layernorm", 3),
        ("mm", "aten.mm.default", f"layers.{_layer}.mlp.fc1", 2),
        ("gelu", "aten.gelu.default", f"layers.{_layer}.mlp.act", 1),
        ("mm", "aten.mm.default", f"layers.{_layer}.mlp.fc2", 2),
        ("add", "aten.add.Tensor", f"layers.{_layer}", 2),
    ]
OPS += [
    ("native_layer_norm", "aten.native_layer_norm.default", "norm", 3),
    ("mm", "aten.mm.default", "lm_head", 2),
    ("_log_softmax", "aten._log_softmax.default", "", 1),
]

ROOTS = {
    # key -> (module of the root-cause op, base name)
    "matmul": ("layers.1.mlp.fc1", "mm"),
    "layer_norm": ("layers.0.input_layernorm", "native_layer_norm"),
}


def _records(step: int, rank: int) -> list[dict[str, Any]]:
    """Forward records with msprobe-style names (``Aten.mm.7.forward``) and a backward tail."""
    counters: dict[str, int] = {}
    out = []
    for i, (base, op, module, n_in) in enumerate(OPS):
        c = counters.get(base, 0)
        counters[base] = c + 1
        out.append(dict(name=f"Aten.{base}.{c}.forward", base=base, op=op, module=module, n_in=n_in,
                        phase="forward", step=step, rank=rank, order=i))
    for j, (base, op, module, n_in) in enumerate(reversed(OPS[-4:])):
        bbase = f"{base.lstrip('_')}_backward"
        c = counters.get(bbase, 0)
        counters[bbase] = c + 1
        out.append(dict(name=f"Aten.{bbase}.{c}.backward", base=bbase, op=f"aten.{bbase}.default",
                        module=module, n_in=2, phase="backward", step=step, rank=rank, order=len(OPS) + j))
    return out


def make_rows(root: str | None, *, steps: int = 1, ranks: int = 1, seed: int = 0,
              errors_without_root: bool = False) -> tuple[pd.DataFrame, Suspect | None, list[Suspect]]:
    """Rows (one per tensor), the root-cause Suspect and the suspects list."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    suspects: list[Suspect] = []
    root_suspect: Suspect | None = None
    for step in range(steps):
        for rank in range(ranks):
            recs = _records(step, rank)
            root_idx = None
            if root is not None:
                mod, base = ROOTS[root]
                root_idx = next(r["order"] for r in recs if r["module"] == mod and r["base"] == base)
            err_in = 1.1e-7
            for rec in recs:
                is_root = rec["order"] == root_idx
                after = root_idx is not None and rec["order"] > root_idx
                out_err = 3.2e-3 if is_root else (err_in * 1.3 if after else 1.2e-7)
                if errors_without_root and rec["base"] == "gelu" and rec["module"] == "layers.0.mlp.act":
                    out_err = 0.5  # a shape/dtype-like error the root-cause search did not explain
                tensors = [(f"input.{k}", "input", err_in if k == 0 else 0.0) for k in range(rec["n_in"])]
                tensors.append(("output.0", "output", out_err))
                for tname, io, err in tensors:
                    bench = rng.normal(0.0, 1.0, size=4)
                    dev = bench * (1 + err)
                    cos = 1 - err * err / 2
                    verdict = "pass"
                    reason = ""
                    if io == "output" and err > 1e-3:
                        verdict = "error" if (is_root or err > 4e-3 or errors_without_root) else "warning"
                        reason = f"rel_l2 {err:.2e} > 1e-3 (allclose rtol 1e-3)"
                    shape = [4, 64] if rec["base"] != "bmm" else [2, 4, 64]
                    dtype = "float16" if "mm" in rec["base"] else "float32"
                    row = dict(
                        device_name=rec["name"], bench_name=rec["name"], tensor=tname, op=rec["op"],
                        module=rec["module"], phase=rec["phase"], step=step, rank=rank, order=rec["order"],
                        io=io, match="exact", device_dtype=dtype, bench_dtype=dtype,
                        device_shape=shape, bench_shape=list(shape),
                        cosine=cos, max_abs_err=err * 2.5, max_rel_err=err * 40, mean_rel_err=err,
                        rmse=err * 0.9, euc_dist=err * 16, one_thousandth_ratio=1.0 if err < 1e-4 else 0.018,
                        five_thousandth_ratio=1.0 if err < 1e-4 else 0.62, worst_index=int(rng.integers(0, 256)),
                        rel_l2=err,
                        device_max=dev.max(), device_min=dev.min(), device_mean=dev.mean(),
                        device_norm=float(np.linalg.norm(dev)), bench_max=bench.max(), bench_min=bench.min(),
                        bench_mean=bench.mean(), bench_norm=float(np.linalg.norm(bench)),
                        max_diff=dev.max() - bench.max(), min_diff=dev.min() - bench.min(),
                        mean_diff=dev.mean() - bench.mean(),
                        norm_diff=float(np.linalg.norm(dev) - np.linalg.norm(bench)),
                        max_rel_diff=err, min_rel_diff=err, mean_rel_diff=err, norm_rel_diff=err,
                        device_nan=0, device_inf=0, bench_nan=0, bench_inf=0, nonfinite_mismatch=False,
                        device_md5=None, bench_md5=None,
                        verdict=verdict, reason=reason, checker="allclose" if verdict != "pass" else "",
                        error=err, stack=["train.py:88 in train_step", f"model.py:{40 + rec['order']} in forward"],
                    )
                    rows.append(row)
                if is_root:
                    s = Suspect(
                        name=rec["name"], op=rec["op"], module=rec["module"], phase=rec["phase"], step=step,
                        rank=rank, index=rec["order"], score=out_err / err_in, input_error=err_in,
                        output_error=out_err,
                        reason=(f"output rel_l2 {out_err:.2e} while inputs match to {err_in:.2e} "
                                f"(amplification x{out_err / err_in:.3g})"),
                        bench_name=rec["name"], level="aten",
                        stack=["train.py:88 in train_step", f"model.py:{40 + rec['order']} in forward"],
                    )
                    if root_suspect is None:
                        root_suspect = s
                    suspects.append(s)
                elif after and len(suspects) < 4 and rec["phase"] == "forward":
                    suspects.append(Suspect(
                        name=rec["name"], op=rec["op"], module=rec["module"], phase=rec["phase"], step=step,
                        rank=rank, index=rec["order"], score=1.3, input_error=err_in, output_error=out_err,
                        reason=f"output rel_l2 {out_err:.2e}, inputs {err_in:.2e} (x1.3)",
                        bench_name=rec["name"], level="aten",
                    ))
                if is_root or after:
                    err_in = out_err
            # an extra op on the device side only: unmatched rows
            for tname, io in (("input.0", "input"), ("output.0", "output")):
                rows.append(dict(device_name="Aten.mul.0.forward", bench_name=None, tensor=tname,
                                 op="aten.mul.Tensor", module="layers.1.mlp", phase="forward", step=step,
                                 rank=rank, order=len(OPS) + 10, io=io, match="unmatched",
                                 device_dtype="float32", bench_dtype=None, device_shape=[4, 256],
                                 bench_shape=None, verdict="skip", reason="no benchmark record",
                                 checker="", stack=None))
    frame = pd.DataFrame(rows)
    # special values: a zero benchmark value (inf relative error), NaN device statistics
    frame.loc[3, "max_rel_err"] = math.inf
    frame.loc[5, ["device_max", "device_mean"]] = [math.nan, math.nan]
    frame.loc[5, "device_nan"] = 1
    return frame, root_suspect, suspects


def summarize(frame: pd.DataFrame, root: Suspect | None) -> dict[str, Any]:
    """A summary with the keys the compare engine writes (``torchparity.compare.api._summary``):
    unmatched rows split by side, ``first_divergence`` with name/step/rank/index only."""
    counts = frame["verdict"].value_counts()
    unmatched = frame["match"] == "unmatched"
    summary: dict[str, Any] = {
        "device_dump": "dumps/npu", "bench_dump": "dumps/cpu",
        "device_format": "torchparity", "bench_format": "torchparity",
        "mode": "tensor",
        "steps": sorted(int(x) for x in frame["step"].unique()),
        "ranks": sorted(int(x) for x in frame["rank"].unique()),
        "n_rows": int(len(frame)),
        "n_compared": int((~unmatched).sum()),
        "n_unmatched_device": int((unmatched & frame["bench_name"].isna()).sum()),
        "n_unmatched_bench": int((unmatched & frame["device_name"].isna()).sum()),
        "n_pass": int(counts.get("pass", 0)),
        "n_warning": int(counts.get("warning", 0)),
        "n_error": int(counts.get("error", 0)),
        "n_skip": int(counts.get("skip", 0)),
        "first_divergence": None,
        "threshold": 10.0,
        "checkers": ["allclose", "md5", "overflow"],
        "warnings": [],
    }
    if root is not None:
        summary["first_divergence"] = {"step": root.step, "rank": root.rank, "name": root.name, "index": root.index}
    else:
        bad = frame[frame["verdict"].isin(["warning", "error"])].sort_values(["step", "rank", "order"])
        if len(bad):
            r = bad.iloc[0]
            summary["first_divergence"] = {"step": int(r["step"]), "rank": int(r["rank"]),
                                           "name": r["device_name"], "index": int(r["order"])}
    summary["diverged"] = root is not None or summary["n_error"] > 0
    return summary


def build_result(root: str | None = "matmul", **kw: Any) -> CompareResult:
    frame, rc, suspects = make_rows(root, **kw)
    if kw.get("errors_without_root"):
        rc, suspects = None, []
    return CompareResult(rows=frame, summary=summarize(frame, rc), root_cause=rc, suspects=suspects)


@pytest.fixture
def make_result() -> Callable[..., CompareResult]:
    """Factory: ``make_result(root="matmul" | "layer_norm" | None, errors_without_root=False)``."""
    return build_result


@pytest.fixture
def compare_result() -> CompareResult:
    """A matmul root cause at ``layers.1.mlp.fc1``."""
    return build_result("matmul")


def big_result(n_rows: int) -> CompareResult:
    """The matmul result tiled over steps until it has ``n_rows`` rows (for size tests)."""
    base = build_result("matmul")
    per = len(base.rows)
    frames = []
    for i in range(n_rows // per + 1):
        f = base.rows.copy()
        f["step"] = i
        frames.append(f)
    rows = pd.concat(frames, ignore_index=True).iloc[:n_rows].reset_index(drop=True)
    return CompareResult(rows=rows, summary=summarize(rows, base.root_cause), root_cause=base.root_cause,
                         suspects=base.suspects)


def agreeing_result() -> CompareResult:
    """Two runs that agree: every row passes, no suspects."""
    frame, _, _ = make_rows(None)
    frame = frame[frame["match"] != "unmatched"].reset_index(drop=True)
    frame["verdict"] = "pass"
    frame["reason"] = ""
    frame["checker"] = ""
    return CompareResult(rows=frame, summary=summarize(frame, None))


def empty_result() -> CompareResult:
    """Nothing compared: no rows at all."""
    frame = pd.DataFrame(columns=["device_name", "bench_name", "verdict", "match", "step", "rank", "order"])
    return CompareResult(rows=frame, summary=summarize(frame, None))


@pytest.fixture
def agreeing() -> CompareResult:
    return agreeing_result()


@pytest.fixture
def empty() -> CompareResult:
    return empty_result()


@pytest.fixture(scope="session")
def big() -> CompareResult:
    """100,000 rows (shared by the size tests; reporters must not modify it)."""
    return big_result(100_000)


@pytest.fixture(scope="session")
def real_compare(tmp_path_factory: pytest.TempPathFactory) -> CompareResult:
    """A real ``torchparity.compare`` of two synthetic tensor dumps: a x1.01 fault planted at
    ``layers.1.act``'s gelu and an extra op on the device side. Skipped when the compare engine
    is not installed."""
    api = pytest.importorskip("torchparity.compare.api")
    testing = pytest.importorskip("torchparity.compare._testing")
    root = tmp_path_factory.mktemp("real_compare")
    dev = testing.mlp_stack_dump(root / "dev", "tensor", fault=("layers.1.act", 1.01), extra_op="layers.2")
    ben = testing.mlp_stack_dump(root / "ben", "tensor")
    return api.compare(dev, ben, formats=[])
