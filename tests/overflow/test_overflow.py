"""The overflow checker on real dumps (statistics mode) of small models, and ``torchparity overflow``.

Faults are planted with a tiny test-local TorchDispatchMode entered *outside* the dump, so the
dump records what the "device" produced. It leaves torchparity's own statistics work alone
(:func:`torchparity.capture.session.tool_is_busy`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchparity
from torchparity.capture.session import tool_is_busy
from torchparity.cli.overflow_cmd import analyse
from torchparity.toymodels import make_batches, make_model, train
from torchparity_checker_overflow import OverflowChecker


class Plant(TorchDispatchMode):
    """Rewrites the output of the ``call``-th call of ``op``: ``fn(output) -> new output``."""

    def __init__(self, op: Any, fn: Any, call: int = 0) -> None:
        super().__init__()
        self.op, self.fn, self.call, self.seen = op, fn, call, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.op and not tool_is_busy():
            if self.seen == self.call:
                out = self.fn(out)
            self.seen += 1
        return out


def one_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[3] = float("nan")
    return t


def checker(**options: Any) -> OverflowChecker:
    c = OverflowChecker()
    c.configure(options)
    return c


def scan(path: Path, **options: Any):
    return checker(**options).scan_dump(torchparity.load_dump(path))


@pytest.fixture(scope="module")
def nan_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TinyLlama, one training step, a NaN planted in the 2nd SiLU (layers.1.mlp)."""
    path = tmp_path_factory.mktemp("overflow") / "nan"
    model = make_model()
    with Plant(torch.ops.aten.silu.default, one_nan, call=1), \
            torchparity.dump(str(path), fsync=False, level="aten", mode="statistics", model=model, stack=True):
        train(model, make_batches(1))
    return path


@pytest.fixture(scope="module")
def clean_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("overflow") / "clean"
    model = make_model()
    with torchparity.dump(str(path), fsync=False, level="aten", mode="statistics", model=model):
        train(model, make_batches(1))
    return path


# ------------------------------------------------------------------------------------ classification
def test_planted_nan_is_critical_at_that_op_and_high_or_medium_downstream(nan_dump: Path):
    df = torchparity.load_dump(nan_dump)
    assert set(df["mode"] if "mode" in df else ["statistics"]) and df["file"].isna().all()  # statistics only
    res = scan(nan_dump)
    crit = res[res["level"] == "critical"]
    assert len(crit) == 1, crit
    c = crit.iloc[0]
    assert c["op"] == "aten.silu.default" and c["module"] == "layers.1.mlp" and c["phase"] == "forward"
    before = res[res["record_id"] < c["record_id"]]
    assert before["level"].isna().all(), before[before["level"].notna()]
    after = res[res["record_id"] > c["record_id"]]
    levels = set(after["level"].dropna())
    assert levels <= {"high", "medium"} and "high" in levels and "medium" in levels
    # the NaN reaches the loss, the backward pass and the optimizer: all of it high/medium, never blamed
    assert {"forward", "backward", "optimizer"} <= set(after.loc[after["level"] == "high", "phase"])
    # the first op downstream of the culprit that reads its output is "propagated", not critical
    consumer = df[df["producer"].apply(lambda p: isinstance(p, tuple) and p[0] == c["record_id"])]
    assert set(res.set_index("record_id").loc[consumer["record_id"].unique(), "level"]) <= {"high"}


def test_clean_transformer_with_causal_mask_reports_nothing(clean_dump: Path):
    res = scan(clean_dump)
    assert res["level"].isna().all(), res[res["level"].notna()]
    # the -inf of masked_fill(mask, -inf) is there, on purpose; without the by-design rule it is a
    # creation site, and the sink rule still says it is absorbed (the softmax), not a finding
    naive = scan(clean_dump, by_design=False)
    assert naive["level"].isna().all(), naive[naive["level"].notna()]
    assert set(naive.loc[naive["site"] == "absorbed", "op"]) == {"aten.masked_fill.Scalar"}


def test_nan_inside_masked_scores_is_still_found(tmp_path: Path):
    """The by-design rule does not hide a real NaN that flows through masked_fill."""
    model = make_model()
    path = tmp_path / "d"
    # the 1st matmul of layers.0.self_attn computes the attention scores that masked_fill reads
    with Plant(torch.ops.aten.bmm.default, one_nan, call=0), torchparity.dump(str(path), fsync=False, level="aten", model=model):
        model(make_batches(1)[0][0])
    res = scan(path)
    # the NaN is a creation site at the bmm (not hidden by the mask rule); the softmax absorbs it
    # before the model's output (which holds no NaN), so it is listed as information (issue 14)
    sites = res[res["site"].notna()]
    assert list(sites["op"]) == ["aten.bmm.default"] and list(sites["module"]) == ["layers.0.self_attn"]
    assert list(sites["site"]) == ["absorbed"] and res["level"].isna().all()
    masked = res[res["op"] == "aten.masked_fill.Scalar"]
    assert "absorbed site Aten.bmm.0.forward" in masked.iloc[0]["reason"]


# ------------------------------------------------------------------------------------ saturation
def _saturate(dtype: torch.dtype):
    big = torch.finfo(dtype).max
    return lambda t: torch.nan_to_num(t, posinf=big, neginf=-big)  # what saturating hardware returns


@pytest.mark.parametrize("dtype, value", [(torch.float16, 300.0), (torch.bfloat16, 1e20)])
def test_saturation_at_dtype_max_counts_as_overflow(tmp_path: Path, dtype: torch.dtype, value: float):
    x = torch.full((8,), value, dtype=dtype)
    path = tmp_path / "sat"
    with Plant(torch.ops.aten.mul.Tensor, _saturate(dtype)), torchparity.dump(str(path), fsync=False, level="aten"):
        y = x * x  # overflows; the "device" saturates to the dtype's max instead of Inf
        z = y + 1
    assert torch.isfinite(z).all() and float(y.max()) == torch.finfo(dtype).max
    res = scan(path)
    crit = res[res["level"] == "critical"]
    assert list(crit["op"]) == ["aten.mul.Tensor"] and "saturated" in crit.iloc[0]["reason"]
    assert res.loc[res["op"] == "aten.add.Tensor", "level"].tolist() == ["high"]
    off = scan(path, saturation=False)  # the option is honoured: nothing counts as saturated
    assert "critical" not in set(off["level"].dropna())
    assert not off["reason"].fillna("").str.contains("saturated").any()


def test_large_but_unsaturated_fp16_is_not_overflow(tmp_path: Path):
    path = tmp_path / "ok"
    with torchparity.dump(str(path), fsync=False, level="aten"):
        _ = torch.full((8,), 250.0, dtype=torch.float16) * 250.0  # 62500 < 65504
    assert scan(path)["level"].isna().all()


def test_float32_saturation_only_in_saturation_mode(tmp_path: Path):
    """An Ascend dump header saying ``overflow_mode: saturation`` makes float32 max count too."""
    path = tmp_path / "sat32"
    with Plant(torch.ops.aten.mul.Tensor, _saturate(torch.float32)), torchparity.dump(str(path), fsync=False, level="aten"):
        _ = torch.full((4,), 1e30) * 1e30
    c = OverflowChecker()
    assert analyse(path, checker=c)["counts"]["critical"] == 0
    for header in path.glob("step*/rank*/header.json"):
        h = json.loads(header.read_text())
        h["backend"]["overflow_mode"] = "saturation"
        header.write_text(json.dumps(h))
    report = analyse(path, checker=c)
    assert report["saturation_dtypes"] == ["float32"] and report["counts"]["critical"] == 1


# ------------------------------------------------------------------------------------ AMP
def _amp_run(path: Path) -> tuple[bool, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if not hasattr(torch.amp, "GradScaler"):  # torch < 2.3: no GradScaler for the CPU
        pytest.skip("this torch has no CPU GradScaler (torch.amp.GradScaler, torch >= 2.3)")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # 65536 overflows float16 gradients
    before = [p.detach().clone() for p in model.parameters()]
    with torchparity.dump(str(path), fsync=False, level="aten", model=model):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(4, 8)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return unchanged, scaler.get_scale()


def test_gradscaler_skipped_step_is_reported_not_blamed(tmp_path: Path):
    path = tmp_path / "amp"
    unchanged, scale = _amp_run(path)
    assert unchanged and scale == 2.0**15  # the scaler really skipped the step
    report = analyse(path, checker=OverflowChecker())
    assert report["gradscaler_skipped"] and report["gradscaler_skipped"][0]["step"] == 0
    assert report["counts"]["critical"] == 0 and report["first_critical"] == []
    res = scan(path)
    skipped = res[res["amp_skipped"] & res["reason"].str.contains("GradScaler")]
    # the fp16 cast of the scaled gradient is where it overflowed: labelled, not blamed
    assert "aten._to_copy.default" in set(skipped["op"]) and skipped["level"].isna().all()
    # without the rule the same op would be blamed
    naive = scan(path, amp_aware=False)
    assert "aten._to_copy.default" in set(naive.loc[naive["level"] == "critical", "op"])


# ------------------------------------------------------------------------------------ CLI
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "torchparity", "overflow", *args], capture_output=True,
                          text=True, env=full_env, timeout=120)


def test_cli_prints_first_critical_with_module_and_stack_and_writes_json(nan_dump: Path, tmp_path: Path):
    out = tmp_path / "out"
    r = _cli(str(nan_dump), "-o", str(out))
    assert r.returncode == 1, r.stderr
    assert "Aten.silu.1.forward" in r.stdout and "layers.1.mlp" in r.stdout
    assert "test_overflow.py" in r.stdout  # the stack points at the test's code
    report = json.loads((out / "overflow.json").read_text())
    (first,) = report["first_critical"]
    assert first["name"] == "Aten.silu.1.forward" and first["module"] == "layers.1.mlp"
    assert first["step"] == 0 and first["rank"] == 0 and any("test_overflow.py" in f for f in first["stack"])
    assert report["counts"]["critical"] == 1 and report["counts"]["high"] > 0


def test_cli_clean_dump_exits_zero(clean_dump: Path, tmp_path: Path):
    r = _cli(str(clean_dump), "-o", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "no harmful NaN/Inf found" in r.stdout


def test_cli_damaged_clean_dump_is_not_called_clean(clean_dump: Path, tmp_path: Path):
    """A truncated records file (a killed run): what was read is scanned, but "no harmful NaN/Inf"
    is not claimed for what was lost (exit 2, as compare); each warning is printed once."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(clean_dump, bad)
    rec = bad / "step0" / "rank0" / "records.jsonl"
    rec.write_bytes(rec.read_bytes()[: rec.stat().st_size // 2])
    (bad / "step0" / "rank0" / "footer.json").unlink()
    r = _cli(str(bad), "-o", str(tmp_path / "o"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not known to be clean" in r.stdout and "no harmful NaN/Inf found" not in r.stdout
    both = r.stdout + r.stderr
    assert both.count("the last line was truncated") == 1, both
    report = json.loads((tmp_path / "o" / "overflow.json").read_text())
    assert report["complete"] is False and report["damaged"]


def test_cli_lost_step_directory_is_not_called_clean(tmp_path: Path):
    import shutil

    path = tmp_path / "two"
    model = make_model()
    with torchparity.dump(str(path), fsync=False, level="module", model=model):
        train(model, make_batches(2))
    shutil.rmtree(path / "step0")
    r = _cli(str(path), "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "step0/rank0 is missing" in r.stdout, r.stdout + r.stderr
    assert _cli(str(path), "-o", str(tmp_path / "o"), "--step", "1").returncode == 0


def test_cli_missing_dump_is_a_one_line_usage_error(tmp_path: Path):
    r = _cli(str(tmp_path / "nope"), "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "does not exist" in r.stderr


def test_nan_scalar_is_a_creation_not_by_design(tmp_path: Path):
    """``output * float("nan")`` (a forward hook) creates the NaN: the same rule as NanInfTracker
    (issue 14); only Inf and finfo.min scalars (masks) are by design."""
    model = make_model()
    model.layers[0].mlp.register_forward_hook(lambda m, a, out: out * float("nan"))
    path = tmp_path / "d"
    with torchparity.dump(str(path), fsync=False, level="aten", model=model):
        model(make_batches(1)[0][0])
    res = scan(path)
    crit = res[res["level"] == "critical"]
    assert list(crit["op"]) == ["aten.mul.Tensor"], res[res["level"].notna()][["op", "module", "level"]]
