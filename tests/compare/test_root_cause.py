"""The planted op is the root cause: TinyLlama fp32 vs fp32, one fault, several levels and modes."""

from __future__ import annotations

import json
import math
import warnings

import pytest

import torchparity
from torchparity.compat.amp import backward_and_step

# (fault: op, phase, call, factor) -> the module the faulted aten.mm call belongs to
FWD_UP = ("aten.mm.default", "forward", 5, 1.01)  # layers.0.mlp.up_proj forward, x1.01
BWD_UP = ("aten.mm.default", "backward", 5, 10.0)  # layers.1.mlp.up_proj backward, x10
BWD_NAN = ("aten.mm.default", "backward", 2, "nan")  # layers.1.mlp.down_proj backward, NaN
FWD_SILU_NAN = ("aten.silu.default", "forward", 1, "nan")  # layers.1.mlp, NaN
FWD_UP_SMALL = ("aten.mm.default", "forward", 5, 1.5)

CASES = [
    # level, mode, fault, expected name (aten) / (op, module) for api records
    ("aten", "statistics", FWD_UP, "Aten.mm.5.forward", "layers.0.mlp.up_proj"),
    ("aten", "tensor", BWD_UP, "Aten.mm.5.backward", "layers.1.mlp.up_proj"),
    ("aten", "statistics", BWD_NAN, "Aten.mm.2.backward", "layers.1.mlp.down_proj"),
    ("aten", "tensor", FWD_SILU_NAN, "Aten.silu.1.forward", "layers.1.mlp"),
    ("mix", "statistics", FWD_UP_SMALL, "torch.nn.functional.linear", "layers.0.mlp.up_proj"),
    ("mix", "tensor", BWD_UP, "torch.nn.functional.linear", "layers.1.mlp.up_proj"),
    ("mix", "statistics", FWD_SILU_NAN, "torch.nn.functional.silu", "layers.1.mlp"),
    ("api", "tensor", FWD_UP, "torch.nn.functional.linear", "layers.0.mlp.up_proj"),
]


@pytest.mark.parametrize("level,mode,fault,expected,module", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2][0].split('.')[1]}-{c[2][1]}-{c[2][3]}" for c in CASES])
def test_planted_fault_is_root_cause(dumps, level, mode, fault, expected, module):
    bench = dumps(level, mode)
    dev = dumps(level, mode, fault)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # metrics must not warn (0-d, empty, all-zero, NaN tensors)
        res = torchparity.compare(dev, bench)
    rc = res.root_cause
    assert rc is not None, res.summary
    assert rc.module == module
    assert rc.phase == fault[1]
    if level == "aten":
        assert rc.name == expected
    else:
        # the API record of the op itself, not the Linear/MLP module record around it
        assert rc.level == "api" and rc.op == expected, rc
    assert res.suspects[0] is rc
    assert rc.score >= 10
    if fault[3] == "nan":
        assert math.isinf(rc.output_error)
    assert res.diverged
    s = res.summary
    assert s["first_divergence"]["name"] == rc.name
    assert s["first_divergence"]["step"] == 0 and s["first_divergence"]["rank"] == 0
    # the planted row is an error verdict
    planted = res.rows[(res.rows["device_name"] == rc.name) & (res.rows["io"] == "output")]
    assert (planted["verdict"] == "error").any()


def test_identical_runs_agree(dumps):
    res = torchparity.compare(dumps("aten", "statistics"), dumps("aten", "statistics"))
    assert res.root_cause is None and res.suspects == []
    assert res.summary["n_error"] == 0 and res.summary["n_warning"] == 0
    assert not res.diverged
    assert set(res.rows["match"]) == {"exact"}


def test_extra_op_on_one_side_does_not_mispair(dumps):
    """An extra clone() after layers.0.mlp on the device: only the clone is unpaired, every other
    record pairs with its namesake, and nothing is reported as diverged."""
    bench = dumps("aten", "statistics")
    dev = dumps("aten", "statistics", extra_clone_in="layers.0.mlp")
    res = torchparity.compare(dev, bench)
    rows = res.rows
    unmatched = rows[rows["match"] == "unmatched"]
    assert len(unmatched) and set(unmatched["op"]) == {"aten.clone.default"}
    assert (unmatched["device_record_id"] >= 0).all()  # device-only
    paired = rows[rows["match"] != "unmatched"]
    clones = paired["op"] == "aten.clone.default"
    # every other record pairs with its namesake; later clones pair by module and call index
    # (their name counter is shifted by the extra one)
    assert (paired.loc[~clones, "device_name"] == paired.loc[~clones, "bench_name"]).all()
    assert clones.sum() and (paired.loc[clones, "match"] == "exact").all()
    assert res.root_cause is None and res.summary["n_error"] == 0


def test_extra_op_and_fault(dumps):
    bench = dumps("aten", "statistics")
    dev = dumps("aten", "statistics", FWD_UP, extra_clone_in="layers.0.self_attn")
    res = torchparity.compare(dev, bench)
    assert res.root_cause is not None and res.root_cause.name == "Aten.mm.5.forward"


def test_md5_mode_names_the_op(dumps):
    res = torchparity.compare(dumps("aten", "md5", FWD_UP), dumps("aten", "md5"))
    assert res.root_cause is not None and res.root_cause.name == "Aten.mm.5.forward"
    assert res.summary["mode"] == "md5"
    row = res.rows[(res.rows["device_name"] == "Aten.mm.5.forward") & (res.rows["io"] == "output")]
    assert (row["md5_equal"] == False).all()  # noqa: E712


def test_per_op_tolerance_override(dumps, tmp_path):
    """plugins.yaml can loosen the tolerance of one op and dtype: the x1.01 mm output passes."""
    from torchparity.plugins import build_registry
    from torchparity.config import load_config

    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("version: 1\ncheckers:\n  - allclose:\n      overrides:\n"
                   "        - {op: 'aten.mm*', dtype: float32, rtol: 0.05}\n")
    reg = build_registry(load_config(str(cfg)))
    dev, bench = dumps("aten", "statistics", FWD_UP), dumps("aten", "statistics")
    strict = torchparity.compare(dev, bench)
    loose = torchparity.compare(dev, bench, plugins=reg)
    sel = lambda r: r[(r["device_name"] == "Aten.mm.5.forward") & (r["io"] == "output")]["verdict"].tolist()  # noqa: E731
    assert sel(strict.rows) == ["error"]
    assert sel(loose.rows) == ["pass"]


def test_checksums_of_different_algorithms_are_not_compared(dumps, tmp_path, caplog):
    """An older dump's MD5 (32 hex digits) against today's XXH3-64 (16) is not 'different'."""
    import shutil
    from pathlib import Path

    bench = Path(dumps("aten", "md5"))
    old = tmp_path / "old_md5"
    shutil.copytree(bench, old)
    for f in old.glob("step*/rank*/records.jsonl"):
        lines = []
        for line in f.read_text().splitlines():
            r = json.loads(line)
            for t in r["tensors"]:
                if t.get("md5"):
                    t["md5"] = t["md5"] * 2  # 32 digits, as MD5 wrote them
            lines.append(json.dumps(r))
        f.write_text("\n".join(lines) + "\n")
    res = torchparity.compare(str(bench), str(old))
    assert res.rows["md5_equal"].isna().all() and not res.rows["md5_comparable"].any()
    assert res.root_cause is None
    assert "different algorithms" in caplog.text


def test_clean_t5_with_dropout_in_bf16_against_fp32_blames_no_dropout_product(tmp_path):
    """Found by a new-user check (session 15): a clean HF T5 (dropout 0.1, train mode) under bf16
    autocast against fp32, aten level: the attention dropout's ``mul`` by its mask was the root
    cause, amplified 14.7x. The mask is the same on both sides (min 0, error 0): the product
    selects a subset of the softmax output, whose exact row sums no longer hold, so it is judged
    as a selection (only when its inputs agree). (Other dropout masks of the same model still
    bring a false alarm in the attention's backward bmm, amplified 11.8x: not fixed yet.)"""
    pytest.importorskip("transformers")
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    def make():
        cfg = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=256,
                       decoder_start_token_id=0)
        return T5ForConditionalGeneration(cfg)

    def loss(m, g):  # the dropout masks: the global generator after the same init
        ids, labels = torch.randint(0, 256, (2, 16), generator=g), torch.randint(0, 256, (2, 8), generator=g)
        return m(input_ids=ids, labels=labels).loss

    res = _bf16_against_fp32(tmp_path, make, loss, "aten")
    assert res.root_cause is None, res.root_cause


@pytest.mark.parametrize("level", ["module"])
def test_clean_cnn_with_batchnorm_in_bf16_against_fp32_has_no_root_cause(tmp_path, level):
    """Found by a new-user check (session 15): Conv-BN-ReLU x2, pool, Linear, a 4x3x8x8 batch, two
    AdamW steps under bf16 autocast against fp32. Module level blamed the BatchNorm bias gradient
    (x23.8: a sum over 256 terms that nearly cancel, now allowed sqrt(m) ||g_out|| / ||g_bias||
    times its input's error). (The api and mix levels still blame conv2d's backward record, x10.4:
    its weight gradient is a sum over the batch inside a record scored as a matmul; not fixed.)"""
    import torch
    from torch import nn

    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                             nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def loss(m, g):
        x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
        return nn.functional.cross_entropy(m(x), y)

    res = _bf16_against_fp32(tmp_path, make, loss, level)
    assert res.root_cause is None, res.root_cause


def test_clean_cnn_under_fp16_autocast_does_not_blame_a_batchnorm_scale_gradient(tmp_path):
    """Found by a new-user check (session 16): the same kind of CNN on 2x3x32x32 images under fp16
    autocast with a GradScaler against fp32, module level, blamed the BatchNorm scale gradient
    (x154): a sum over 2048 terms whose norm is far below its terms'. A per-channel weight gradient
    now gets the bias gradient's allowance (grad_sinks.sum_allowance); a planted x1.05 on a
    module's output is still named. (The convolution's weight gradient is still blamed, x23.9:
    the same allowance for weight kernels, sqrt(K) ||x|| ||g_out|| / ||g||, hid planted x1.05
    backward-matmul faults on 7 of the zoo's 11 models, so it is not applied.)"""
    import contextlib

    import torch
    from torch import nn

    import warnings

    try:  # CPU autocast in float16 and the CPU GradScaler exist from torch 2.3 (2.1: bfloat16 only,
        # with a warning at construction and an error on entry)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.autocast("cpu", dtype=torch.float16):
                pass
        torch.amp.GradScaler("cpu")
    except Exception as exc:  # noqa: BLE001 - RuntimeError, UserWarning, AttributeError, TypeError
        pytest.skip(f"no float16 autocast or GradScaler on the CPU in this torch: {exc}")

    def run(name, fp16, fault=False):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
        if fault:
            m[5].register_forward_hook(lambda mod, i, o: o * 1.05)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if fp16 else None
        g = torch.Generator().manual_seed(1)
        with torchparity.dump(str(tmp_path / name), model=m, level="module"):
            for _ in range(2):
                x, y = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 4, (2,), generator=g)
                with torch.autocast("cpu", dtype=torch.float16) if fp16 else contextlib.nullcontext():
                    loss = nn.functional.cross_entropy(m(x).float(), y)
                backward_and_step(loss, opt, scaler)
                opt.zero_grad()

    run("fp32", False)
    run("fp16", True)
    run("fault", False, fault=True)
    res = torchparity.compare(str(tmp_path / "fp16"), str(tmp_path / "fp32"))
    blamed = {s.name for s in res.suspects}
    assert not blamed & {"Grad.1.weight.0.backward", "Grad.4.weight.0.backward"}, blamed
    found = torchparity.compare(str(tmp_path / "fault"), str(tmp_path / "fp32")).root_cause
    assert found is not None and found.module == "5" and found.phase == "forward", found


def _bf16_against_fp32(tmp_path, make, loss, level: str):
    """Two AdamW steps of ``make()`` (seed 0) dumped at ``level``, under bf16 autocast and in fp32
    (batches from generators seeded 1, 2), compared."""
    import torch

    for name, bf16 in (("fp32", False), ("bf16", True)):
        torch.manual_seed(0)
        m = make()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        with torchparity.dump(str(tmp_path / name), model=m, level=level):
            for s in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    value = loss(m, torch.Generator().manual_seed(s + 1))
                value.backward()
                opt.step()
                opt.zero_grad()
    return torchparity.compare(str(tmp_path / "bf16"), str(tmp_path / "fp32"))


@pytest.mark.parametrize("mask_value", [1.0, 1.0 / 0.9])
def test_a_fault_in_a_product_with_a_shared_mask_is_still_named(tmp_path, mask_value):
    """Found by the session-15 review: the dropout-mask rule first judged every product with a
    shared 0/s mask as a selection, so a planted x1.05 (even x2) in ``h * padding_mask`` was no
    root cause. A 0/1 mask keeps the product fully judged; a scaled (dropout) mask loses only the
    aggregate channel, and a x2 fault shows in the extreme one."""
    import torch
    from torch import nn
    from torchparity_backend_emulated import Fault, emulate

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x, mask):
            return self.fc2(torch.tanh(self.fc1(x)) * mask)

    def run(path, dtype, faults=()):
        torch.manual_seed(0)
        m = Net()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
        mask = ((torch.arange(8) < 5).float() * mask_value)[:, None].expand(8, 32).contiguous()
        with emulate(dtype=dtype, faults=list(faults)):
            with torchparity.dump(str(path), model=m, level="aten"):
                m(x, mask).pow(2).mean().backward()

    run(tmp_path / "bench", None)
    run(tmp_path / "clean", "bfloat16")
    assert torchparity.compare(str(tmp_path / "clean"), str(tmp_path / "bench")).root_cause is None
    factor = 1.05 if mask_value == 1.0 else 2.0
    run(tmp_path / "dev", "bfloat16", [Fault(op="aten.mul.Tensor", phase="forward", call=0, factor=factor)])
    rc = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench")).root_cause
    assert rc is not None and rc.name == "Aten.mul.0.forward", rc
