"""A bf16 graph under Inductor: capturing must not make Inductor store (round) values it would keep
in float32 registers. Found on a CNN with Dropout in bf16: the dropout's random values, captured,
were stored as bf16 before the comparison with p, and the mask changed."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchparity
from torchparity.compile import compile_backend

pytestmark = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                                reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)")


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _run(backend):
    torch.manual_seed(0)
    m = DropNet().to(torch.bfloat16)
    torch._dynamo.reset()
    run = torch.compile(m, backend=backend)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    torch.manual_seed(1)
    loss = run(x).float().pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def test_bf16_inductor_numerics_unchanged_by_the_capture(tmp_path):
    l0, g0 = _run("inductor")
    cap = compile_backend(tmp_path / "d")
    l1, g1 = _run(cap)
    cap.close()
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    # what was left out is said in the header, and the matmuls (stored anyway) are captured
    not_captured = cap.header()["not_captured"]
    assert any("keep in registers" in k for k in not_captured), not_captured
    df = torchparity.load_dump(tmp_path / "d")
    assert {"body.0", "body.4", "body.7"} <= set(df.loc[df["op"].astype(str).str.contains("addmm|convolution"), "module"])


class Tied(nn.Module):
    """An embedding whose weight is also the output projection's (BERT/GPT-style weight tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.mid = nn.Linear(32, 32)
        self.dec = nn.Linear(32, 64, bias=False)
        self.dec.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.tanh(self.mid(self.emb(ids))))


def _tied(backend):
    torch.manual_seed(0)
    m = Tied().to(torch.bfloat16)
    torch._dynamo.reset()
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    torch.compile(m, backend=backend)(ids).float().logsumexp(-1).mean().backward()
    return [p.grad.clone() for p in m.parameters()]


def test_a_matmul_inductor_folds_into_its_add_is_left_alone(tmp_path):
    """The tied weight's gradient is the decoder's matmul plus the embedding's scatter: Inductor folds
    the add into the matmul when the matmul has one reader. Capturing the matmul would add a reader
    (with the rule off, ``_fusable_matmul`` returning False, the gradient differs: checked by hand)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # Inductor's CPU scatter-add is deterministic on one thread only
    try:
        plain = _tied("inductor")
        cap = compile_backend(tmp_path / "d")
        got = _tied(cap)
        cap.close()
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(plain, got))
    assert any("fold" in k for k in cap.header()["not_captured"])
