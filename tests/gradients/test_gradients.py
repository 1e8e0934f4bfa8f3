"""GradMonitor + grad_direction checker + `torchparity grads`: no drift for identical runs, the
perturbed step and layer named, training bitwise unchanged, bad input rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchparity.compare._testing import run_cli
from torchparity.errors import UsageError
from torchparity.gradients import GradMonitor, compare_runs, load_run
from torchparity.gradients.sketch import block_signs, summarize
from torchparity.toymodels import make_batches, make_model

STEPS = 3


def _train(out: Path | None, perturb: str | None = None, factor: float = 3.0, *, use_optimizer_hook: bool = True,
           accumulate: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """3 AdamW steps of the tiny llama; ``perturb`` scales that parameter at step 1 (before its forward)."""
    model = make_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = GradMonitor(model, out, optimizer=opt if use_optimizer_hook else None) if out is not None else None
    losses = []
    if mon is not None:
        mon.start()
    try:
        for i, (x, y) in enumerate(make_batches(STEPS)):
            if perturb and i == 1:
                with torch.no_grad():
                    dict(model.named_parameters())[perturb].mul_(factor)
            for _ in range(accumulate):
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                loss.backward()
            opt.step()
            if mon is not None and not use_optimizer_hook:
                mon.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        if mon is not None:
            mon.stop()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grads")
    out = {}
    for name, perturb in (("a", None), ("b", None), ("up", "layers.1.mlp.up_proj.weight")):
        out[name] = root / name
        _train(out[name], perturb)
    return out


def test_run_layout(runs):
    run = load_run(runs["a"])
    assert run.ranks == [0] and run.steps(0) == list(range(STEPS))
    d = run.read(0, 1)
    assert d.params[0] == "embed_tokens.weight" and len(d.params) == 21
    assert d.sketch.shape == (21, 256) and d.param_sketch.shape == (21, 256)
    assert d.stats[0, 0] == 128 * 64  # numel
    assert not list(runs["a"].rglob("*.tmp"))


def test_identical_runs_no_drift(runs, tmp_path):
    res = compare_runs(runs["a"], runs["b"], tmp_path / "out")
    assert res.first_drift is None and not res.diverged
    assert res.summary["n_error"] == 0 and res.summary["n_warning"] == 0
    assert (res.rows["cosine"] == 1.0).all() and (res.rows["param_rel_diff"] == 0).all()
    doc = json.loads((tmp_path / "out" / "grad_compare.json").read_text())
    assert doc["diverged"] is False and doc["first_drift"] is None


def test_perturbed_layer_is_named(runs, tmp_path):
    res = compare_runs(runs["up"], runs["a"], tmp_path / "out")
    fd = res.first_drift
    assert fd is not None and res.diverged
    assert fd["step"] == 1 and fd["rank"] == 0
    assert fd["param"] == "layers.1.mlp.up_proj.weight" and fd["kind"] == "parameter"
    assert fd["n_params_drifted"] >= 1
    # step 0 is untouched
    assert (res.rows[res.rows["step"] == 0]["verdict"] == "pass").all()
    doc = json.loads((tmp_path / "out" / "grad_compare.json").read_text(), parse_constant=lambda t: 1 / 0)
    assert doc["first_drift"]["param"] == "layers.1.mlp.up_proj.weight"


def test_sign_flip_drifts_in_that_layer(tmp_path, runs):
    _train(tmp_path / "flip", "layers.1.mlp.down_proj.weight", factor=-1.0)
    res = compare_runs(tmp_path / "flip", runs["a"])
    assert res.first_drift["step"] == 1 and res.first_drift["param"] == "layers.1.mlp.down_proj.weight"
    # the gradients that point the other way are errors with cosine near -1
    worst = res.drifted[0]
    assert worst["param"].startswith("layers.1.mlp.") and worst["cosine"] < -0.9


def test_monitor_does_not_change_training(tmp_path):
    ref_losses, ref_state = _train(None)
    for kw in ({}, {"use_optimizer_hook": False}):
        losses, state = _train(tmp_path / f"m{len(kw)}", **kw)
        assert losses == ref_losses
        assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)


def test_manual_steps_and_accumulation(tmp_path, runs):
    _train(tmp_path / "manual", use_optimizer_hook=False)
    assert compare_runs(tmp_path / "manual", runs["a"]).first_drift is None
    # two identical micro-batches: the accumulated gradient is exactly twice the single one
    _train(tmp_path / "acc", accumulate=2)
    a, b = load_run(tmp_path / "acc").read(0, 0), load_run(runs["a"]).read(0, 0)
    assert a.stats[:, 1] == pytest.approx(2 * b.stats[:, 1], rel=1e-5)


def test_fallback_without_post_accumulate_hook(tmp_path, runs):
    """torch < 2.1 has no register_post_accumulate_grad_hook: gradients are read when the step closes."""
    model = make_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = GradMonitor(model, tmp_path / "fallback", optimizer=opt)
    mon.uses_hooks = False
    with mon:
        for x, y in make_batches(STEPS):
            logits = model(x)
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    assert len(mon.written) == STEPS
    res = compare_runs(tmp_path / "fallback", runs["a"])
    assert res.first_drift is None and (res.rows["cosine"] == 1.0).all()


def test_sketch_estimates_cosine():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 100, generator=g)
    y = x + 0.3 * torch.randn(64, 100, generator=g)
    true = float(F.cosine_similarity(x.reshape(-1), y.reshape(-1), dim=0))
    signs = block_signs("w", x.numel(), 256, seed=0)
    sx, sy = summarize(x, signs, 256)[10:], summarize(y, signs, 256)[10:]
    est = float(F.cosine_similarity(sx, sy, dim=0))
    assert abs(est - true) < 0.03
    assert torch.equal(block_signs("w", 6400, 256, 0), signs) and not torch.equal(block_signs("v", 6400, 256, 0), signs)


def test_nan_gradient_and_tiny_gradient(tmp_path):
    from torchparity_checker_grad_direction import GradDirectionChecker

    import pandas as pd

    rows = pd.DataFrame({"cosine": [1.0, 0.2, 0.995, 1.0], "sign_agreement": [1.0, 0.5, 0.97, 1.0],
                         "norm_share": [1.0, 1e-9, 0.5, 0.5], "norm_a": [1.0, 1e-9, 1.0, 1.0],
                         "norm_b": [1.0, 1e-9, 1.0, 1.0], "nonfinite_a": [0, 0, 0, 3], "nonfinite_b": [0, 0, 0, 0]})
    out = GradDirectionChecker().judge_rows(rows, None)
    assert out["verdict"].tolist() == ["pass", "skip", "warning", "error"]
    assert "NaN/Inf" in out["reason"][3] and "too small" in out["reason"][1]


def test_cli(runs, tmp_path, monkeypatch):
    from torchparity.cli import COMMANDS

    monkeypatch.setitem(COMMANDS, "grads", ("torchparity.cli.grads_cmd", "grads"))
    code, out = run_cli(["grads", str(runs["a"]), str(runs["b"])])
    assert code == 0 and "no gradient direction drift" in out
    code, out = run_cli(["grads", str(runs["up"]), str(runs["a"]), "-o", str(tmp_path / "o")])
    assert code == 1
    assert "first drift: step 1, rank 0, parameter layers.1.mlp.up_proj.weight" in out
    assert (tmp_path / "o" / "grad_compare.json").is_file()
    code, out = run_cli(["grads", str(tmp_path / "nope"), str(runs["a"])])
    assert code == 2 and "no such directory" in out and "Traceback" not in out
    code, out = run_cli(["grads", str(runs["a"]), str(runs["b"]), "--rank", "3"])
    assert code == 2 and "share no (rank, step)" in out


def test_bad_input(runs, tmp_path):
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "torchparity.json").write_text("{}")
    with pytest.raises(UsageError, match="looks like a dump"):
        load_run(tmp_path / "dump")
    # a different sketch size cannot be compared
    model = make_model(0)
    with GradMonitor(model, tmp_path / "k64", sketch_dim=64) as mon:
        model(make_batches(1)[0][0]).sum().backward()
        mon.step()
    with pytest.raises(UsageError, match="sketch_dim"):
        compare_runs(tmp_path / "k64", runs["a"])
    # a corrupt step file is a clear DumpError, not a traceback
    from torchparity.errors import DumpError
    import shutil

    shutil.copytree(runs["a"], tmp_path / "corrupt")
    (tmp_path / "corrupt" / "rank0" / "step0000001.safetensors").write_bytes(b"garbage")
    with pytest.raises(DumpError, match="unreadable gradient step file"):
        compare_runs(tmp_path / "corrupt", runs["a"])
    with pytest.raises(UsageError, match="no trainable parameters"):
        GradMonitor(torch.nn.ReLU(), tmp_path / "x")
