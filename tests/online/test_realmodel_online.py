"""Online compare on real models must never break the user's training (issue 14).

An ``nn.LSTM`` language model in bf16 under online compare used to abort the whole process
("double free or corruption", exit 134): ``mkldnn_rnn_layer_backward`` was re-run on the
reference in float32 with the bf16 forward's workspace, smaller than what a float32 kernel reads.
It also reported false errors on the forward's workspace output (bytes and size differ with the
dtype). Each model runs in a subprocess, so an abort fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchparity.online.compare as online
from torchparity.online.compare import CompareWithReference

_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torchparity.online.compare import CompareWithReference

    class LM(torch.nn.Module):
        def __init__(self, kind, hidden):
            super().__init__()
            self.emb = torch.nn.Embedding(50, hidden)
            self.rnn = getattr(torch.nn, kind)(hidden, hidden, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(hidden, 50)

        def forward(self, x):
            return self.head(self.rnn(self.emb(x))[0])

    def step(kind, dtype, hidden, compare=None):
        torch.manual_seed(0)
        model = LM(kind, hidden).to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 50, (2, 8))
        if compare is not None:
            compare.start()
        try:
            loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
            loss.backward()
            opt.step()
        finally:
            if compare is not None:
                compare.stop()
        return loss.detach()

    for config in sys.argv[1:]:
        kind, dtype, hidden = config.split(":")
        off = step(kind, getattr(torch, dtype), int(hidden))
        c = CompareWithReference()
        on = step(kind, getattr(torch, dtype), int(hidden), c)
        print(json.dumps({"config": config, "bitwise": bool(torch.equal(on, off)), "checked": c.checked,
                          "failures": [f"{f.name}: {f.reason}" for f in c.failures],
                          "skipped": dict(c.skipped), "log": c.log_lines}), flush=True)
""")


_CONFIGS = ("LSTM:bfloat16:128", "LSTM:float32:32", "GRU:bfloat16:32")


@pytest.fixture(scope="module")
def rnn_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every config in one subprocess (torch is imported once); a crash fails the tests."""
    script = tmp_path_factory.mktemp("online_rnn") / "rnn_online.py"
    script.write_text(_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), *_CONFIGS], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert proc.returncode == 0, f"the user's process died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    res = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["config"]: r for r in res}


@pytest.mark.slow
@pytest.mark.parametrize("config", _CONFIGS[:2])
def test_lstm_under_online_compare_no_crash_no_false_failure(rnn_results: dict[str, dict], config: str) -> None:
    # bf16 at hidden 128: large enough for the workspace overrun to corrupt the heap before the fix
    res = rnn_results[config]
    assert res["bitwise"], "online compare changed the loss"
    assert res["failures"] == [], res["failures"]
    assert res["checked"] > 100
    workspace = [r for r in res["skipped"] if r.startswith("consumes the workspace of its forward kernel")]
    assert workspace and res["skipped"][workspace[0]] == 2  # the two layers' mkldnn_rnn_layer_backward
    assert any("[torchparity:skip] Aten.mkldnn_rnn_layer_backward." in line for line in res["log"])


@pytest.mark.slow
def test_gru_under_online_compare(rnn_results: dict[str, dict]) -> None:
    res = rnn_results["GRU:bfloat16:32"]
    assert res["bitwise"] and res["failures"] == [] and res["checked"] > 100


def test_a_failing_check_is_a_skip_never_an_exception_in_the_users_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: object, **k: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(online, "run_reference", broken)
    x = torch.randn(4, 4)
    with CompareWithReference() as c:
        y = x @ x
    assert torch.equal(y, x @ x)
    assert c.failures == [] and c.checked == 0
    assert any(r.startswith("not judged: the check failed (ValueError: boom)") for r in c.skipped)
