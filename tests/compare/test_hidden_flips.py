"""A threshold's backward hides sparse error from the statistics (compare/hidden_flips.py), and an
api-level ``mul``'s backward holds a sum over its broadcast dimensions (compare/bwd_reductions.py).

Found by a new-user check (session 16) on clean models under fp16 autocast with a GradScaler,
compared with their fp32 runs: a tiny HF T5 was blamed at every level (an ``mm`` weight gradient
x18, a ``bmm`` x13, an RMSNorm ``mul`` x45), a CNN's convolution weight gradient x24 at the api and
module levels. Each sits downstream of a ReLU's backward, whose fp16 mask differs from fp32's on
the elements that rounded across zero: 5% error in a gradient whose statistics moved 0.1%.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import torchparity
from torchparity.compare import hidden_flips
from torchparity.compat.amp import backward_and_step

_AMP = pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch.amp.GradScaler needs torch >= 2.3")


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _t5() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16,
                                vocab_size=128, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.T5ForConditionalGeneration(cfg)


def _train(path: Path, name: str, level: str, amp: bool, fault: str | None = None) -> None:
    """One AdamW step, fp32 or fp16 autocast with a GradScaler (scale 256), dumped at ``level``;
    ``fault``: a module whose forward output is scaled x1.05."""
    torch.manual_seed(0)
    model = _cnn() if name == "cnn" else _t5()
    g = torch.Generator().manual_seed(1)
    if name == "cnn":
        batch = {"x": torch.randn(2, 3, 32, 32, generator=g), "y": torch.randint(0, 4, (2,), generator=g)}
    else:
        ids = torch.randint(1, 128, (2, 16), generator=g)
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[0, -4:] = 0
        batch = {"input_ids": ids, "labels": torch.randint(1, 128, (2, 16), generator=g), "attention_mask": mask}
    if fault:
        dict(model.named_modules())[fault].register_forward_hook(lambda m, i, o: o * 1.05)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if amp else None
    with torchparity.dump(str(path), level=level, model=model):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            if name == "cnn":
                loss = nn.functional.cross_entropy(model(batch["x"]).float(), batch["y"])
            else:
                loss = model(**batch).loss
        backward_and_step(loss, opt, scaler)


@_AMP
@pytest.mark.parametrize(("name", "level"), [("t5", "aten"), ("t5", "api"), ("t5", "module"),
                                             ("cnn", "api"), ("cnn", "module")])
def test_clean_fp16_autocast_run_has_no_root_cause(tmp_path: Path, name: str, level: str) -> None:
    _train(tmp_path / "amp", name, level, amp=True)
    _train(tmp_path / "fp32", name, level, amp=False)
    res = torchparity.compare(str(tmp_path / "amp"), str(tmp_path / "fp32"), step=0)
    assert res.root_cause is None, res.root_cause.reason


@_AMP
@pytest.mark.parametrize(("name", "level", "module"), [("t5", "aten", "encoder.block.1.layer.1.DenseReluDense"),
                                                       ("cnn", "api", "5")])
def test_a_fault_after_a_relu_is_still_named(tmp_path: Path, name: str, level: str, module: str) -> None:
    """The hidden error widens what the judge allows downstream of a ReLU's backward; a x1.05
    forward fault in the fp16-autocast run is still named in its module."""
    pytest.importorskip("transformers") if name == "t5" else None
    _train(tmp_path / "bad", name, level, amp=True, fault=module)
    _train(tmp_path / "good", name, level, amp=False)
    rc = torchparity.compare(str(tmp_path / "bad"), str(tmp_path / "good")).root_cause
    assert rc is not None and rc.module == module and rc.phase == "forward", rc


def _records(ops: list[tuple[int, str, str]], links: dict[int, list[int]]) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """``recs`` (index: record id; op, phase, order) and input rows ``r`` (rid, p_rid) for
    :func:`hidden_flips.hidden_inputs`."""
    recs = pd.DataFrame({"op": [o for _, o, _ in ops], "phase": [p for _, _, p in ops],
                         "order": [i for i, _, _ in ops]}, index=[i for i, _, _ in ops])
    rows = [(rid, p) for rid, ps in links.items() for p in ps] or [(ops[0][0], -1)]
    r = pd.DataFrame({"rid": [a for a, _ in rows], "p_rid": [b for _, b in rows]})
    return recs, r, pd.Series(True, index=r.index)


def test_hidden_error_flows_from_a_threshold_backward_to_its_readers_only() -> None:
    recs, r, is_in = _records([(1, "aten.relu.default", "forward"), (2, "aten.mm.default", "backward"),
                               (3, "aten.threshold_backward.default", "backward"),
                               (4, "aten.mm.default", "backward"), (5, "aten.mm.default", "backward")],
                              {3: [2], 4: [3], 5: [2]})
    i_err = np.array([1e-3, 1e-3, 5e-4, 1e-3, 1e-3])
    h = hidden_flips.hidden_inputs(recs, r, is_in, i_err)
    assert h[3] == pytest.approx(np.sqrt(hidden_flips.FLIP_FACTOR * 5e-4))  # reads the threshold's gradient
    assert h[4] == 0.0  # reads a gradient computed before the threshold
    assert h[0] == h[1] == h[2] == 0.0  # the forward relu hides nothing; the threshold's own inputs are clean


def test_unlinked_backward_records_take_every_threshold_before_them() -> None:
    """api and module levels link no backward inputs to producers: every backward record after a
    threshold's backward (in execution order) reads its hidden error; forward records do not."""
    recs, r, is_in = _records([(1, "torch.nn.functional.linear", "backward"),
                               (2, "torch.nn.functional.relu", "backward"),
                               (3, "torch.nn.functional.linear", "backward"),
                               (4, "torch.nn.functional.linear", "forward")], {})
    h = hidden_flips.hidden_inputs(recs, r, is_in, np.full(4, 2e-3))
    assert h[0] == 0.0 and h[1] == 0.0 and h[3] == 0.0
    assert h[2] == pytest.approx(np.sqrt(hidden_flips.FLIP_FACTOR * 2e-3))


def test_no_threshold_no_hidden_error() -> None:
    recs, r, is_in = _records([(1, "aten.mm.default", "backward"), (2, "aten.silu_backward.default", "backward")],
                              {2: [1]})
    assert not hidden_flips.hidden_inputs(recs, r, is_in, np.full(2, 1e-2)).any()
