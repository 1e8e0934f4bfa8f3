"""A GradScaler with a compiled model: the scale is applied on both sides, recorded on one.

Found by a new-user check (session 16): an eager aten dump of an fp16-autocast CNN with a
GradScaler against the same run under ``compile_backend`` blamed ``native_batch_norm_backward``.
``scaler.scale(loss)`` runs outside the compiled graph, so only the eager dump recorded the
loss-scale ``mul``; compare divided the eager side's gradients by S while the compiled side's
were just as scaled.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchparity
from torchparity.compile import compile_backend

pytestmark = [
    pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 3),
                       reason="the compile backend and torch.amp.GradScaler need torch >= 2.3"),
]


def _run(backend: object | None, path: Path | None = None) -> list[float]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    torch._dynamo.reset()
    run = torch.compile(net, backend=backend) if backend is not None else net
    if backend is not None:
        backend.attach(opt)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 8, (8,), generator=g)
    losses = []
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(run(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    if backend is not None:
        backend.close()
    return losses


def test_eager_against_compiled_with_a_gradscaler_is_clean(tmp_path: Path) -> None:
    with torchparity.dump(str(tmp_path / "eager"), level="aten"):
        _run(None)
    _run(compile_backend(tmp_path / "comp", inner="eager"))
    for a, b in (("eager", "comp"), ("comp", "eager")):
        res = torchparity.compare(str(tmp_path / a), str(tmp_path / b))
        assert res.root_cause is None, (a, res.root_cause.reason)
        assert any("scales too" in w for w in res.summary["warnings"]), res.summary["warnings"]
        assert not any("compared divided by the scale" in w for w in res.summary["warnings"])
