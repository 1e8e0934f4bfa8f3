"""Compiled (Inductor, decomposed graphs) vs eager: one record per eager op, aligned by the compare."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn

import torchparity
from torchparity.compile import compile_backend
from torchparity.compile.faults import scale_module_output

pytestmark = [
    pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                       reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)"),
    pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")),
                       reason="Inductor needs a C++ compiler on the CPU"),
]


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.act, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(self.act(self.ln(self.fc1(x)))), -1)


def _train(backend=None) -> float:
    torch.manual_seed(0)
    m = Small()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch._dynamo.reset()
    run = torch.compile(m, backend=backend) if backend is not None else m
    if hasattr(backend, "attach"):
        backend.attach(opt)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    opt.zero_grad()
    loss = ((run(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    if hasattr(backend, "close"):
        backend.close()
    return loss.item()


def _records(path):
    return [json.loads(line) for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def eager_dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("eager")
    with torchparity.dump(root / "d", level="aten"):
        _train(None)
    return root / "d"


def test_decomposed_ops_captured_once_as_their_source_op(tmp_path):
    _train(compile_backend(tmp_path / "c"))
    recs = _records(tmp_path / "c")
    fwd = [(r["module"], r["op"]) for r in recs if r["phase"] == "forward"]
    # Inductor decomposes layer_norm, gelu and softmax into var_mean/rsqrt/mul/erf/exp...: each is
    # one record of its source op, named like the eager dump's
    assert fwd == [("fc1", "aten.addmm.default"), ("ln", "aten.native_layer_norm.default"),
                   ("act", "aten.gelu.default"), ("fc2", "aten.addmm.default"), ("", "aten._softmax.default")]
    ln = next(r for r in recs if r["op"] == "aten.native_layer_norm.default")
    assert ln["name"] == "Aten.native_layer_norm.0.forward" and ln["flags"]["graph_nodes"] > 3
    assert ln["tensors"][0]["shape"] == [4, 16]  # output 0 (not mean/rstd)
    bwd = [(r["module"], r["op"]) for r in recs if r["phase"] == "backward"]
    assert ("ln", "aten.native_layer_norm_backward.default") in bwd and ("act", "aten.gelu_backward.default") in bwd
    assert len(bwd) == len(set(r["name"] for r in recs if r["phase"] == "backward"))
    lnb = next(r for r in recs if r["op"] == "aten.native_layer_norm_backward.default")
    assert lnb["tensors"][0]["shape"] == [4, 16] and lnb["flags"]["graph_nodes"] > 3  # grad_input, not grad_weight
    assert not any(r["op"].startswith(("aten.var_mean", "aten.rsqrt", "aten.erf", "prims.")) for r in recs)


def test_inductor_vs_eager_compare_no_false_divergence(tmp_path, eager_dump):
    _train(compile_backend(tmp_path / "c"))
    res = torchparity.compare(eager_dump, tmp_path / "c", output_dir=tmp_path / "out")
    s = res.summary
    n_comp = len(_records(tmp_path / "c"))
    assert s["n_unmatched_bench"] == 0 and s["n_compared"] == n_comp
    assert s["n_error"] == 0 and s["n_warning"] == 0 and not s["diverged"] and res.root_cause is None


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_planted_fault_in_graph_is_named(tmp_path, eager_dump, phase):
    cap = compile_backend(tmp_path / "c", graph_pass=scale_module_output("ln", phase, 1.05))
    _train(cap)
    res = torchparity.compare(eager_dump, tmp_path / "c", output_dir=tmp_path / "out")
    assert res.summary["diverged"]
    rc = res.root_cause
    assert rc is not None and rc.module == "ln" and rc.phase == phase, rc
