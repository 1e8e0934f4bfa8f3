"""Module-level parameter gradients (compare/grad_sinks.py) and discrete integer outputs.

In a module-level dump, the kernel that computed a weight gradient is recorded nowhere but in the
``Grad.<module>.<param>`` record: a x2 fault in the GRU's output-projection weight-gradient matmul
was "no root cause, 0 error rows". A module whose integer output differs (a MoE router's expert
indices) made a discrete choice from inputs that already differed: not the root cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.compare._testing import SyntheticDump

_OLD_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)



@pytest.mark.parametrize(("model", "feature"), [("gru", "fault-bwd-mm-x2-module"), ("gru", "bf16-vs-fp32-module"),
                                                ("cnn", "bf16-vs-fp32-module"), ("cnn", "fault-bwd-mm-x2-module")])
def test_module_level_weight_gradient_fault_is_named(zoo, model: str, feature: str, tmp_path: Path) -> None:
    """The fault is named in its module, phase backward; the clean runs (a conv bias gradient ~0
    before BatchNorm in the CNN) stay clean."""
    cell = zoo.run_cell(model, feature, tmp_path)
    if cell.status == "n/a" or (cell.status == "crash" and _OLD_TORCH):
        pytest.skip(f"{model} / {feature} does not run here: {cell.note}")
    assert cell.status == "OK", f"{model} / {feature}: {cell.status}: {cell.note}"


def _router(tmp_path: Path, side: str, flip: bool) -> str:
    """A router module record: float scores in, indices out (flipped on the device side), then a
    module that reads the indices. The device side routes two tokens elsewhere and runs in bf16 (its inputs carry bf16 rounding)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    if side == "dev":
        x = x.to(torch.bfloat16)
    scores = (x.float() @ w).to(x.dtype)
    idx = scores.float().topk(2, dim=-1).indices
    if flip:  # two tokens routed to other experts
        idx = idx.clone()
        idx[:2] = 3 - idx[:2]
    d = SyntheticDump(tmp_path / side, "statistics", level="module")
    refs = d.op("Router", "gate", [(x, None)], [scores, idx], prefix="Module", base="gate.Router")
    d.op("Experts", "experts", [(x, None), (idx, refs[1])], [x * 2], prefix="Module", base="experts.Experts")
    return str(d.close())


def test_a_router_whose_indices_flip_is_not_the_root_cause(tmp_path: Path) -> None:
    res = torchparity.compare(_router(tmp_path, "dev", flip=True), _router(tmp_path, "bench", flip=False))
    assert res.root_cause is None or res.root_cause.module != "gate", res.root_cause and res.root_cause.reason


def test_indices_that_differ_from_agreeing_inputs_are_still_blamed(tmp_path: Path) -> None:
    """A guard: the selection rule applies only when the inputs already differ."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    paths = []
    for side in ("dev", "bench"):
        idx = x.topk(2, dim=-1).indices
        d = SyntheticDump(tmp_path / side, "statistics", level="module")
        d.op("Router", "gate", [(x, None)], [idx.flip(-1) * 3 if side == "dev" else idx],
             prefix="Module", base="gate.Router")
        paths.append(str(d.close()))
    rc = torchparity.compare(*paths).root_cause
    assert rc is not None and rc.module == "gate"
