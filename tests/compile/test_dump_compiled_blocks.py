"""torchparity.dump(model, level="aten") on an eager model whose blocks are compiled one by one
(``model.blocks[i] = torch.compile(block)``, as large training jobs do): each block's graphs are
captured with the block's module path, forward and backward; the numerics stay the compiled run's
(docs/compile.md, "Compiled blocks")."""

from __future__ import annotations

import functools
import importlib
import json

import pytest
import torch
import torch.nn as nn

import torchparity
from tests.compile.conftest import BlockNet as Net, sgd_in_dump
from torchparity.capture import compiled as compiled_mod
from torchparity.capture.compiled import COMPILED_DUMP_OK, CompiledModelError, compiled_blocks

pytestmark = pytest.mark.skipif(not COMPILED_DUMP_OK or not compiled_mod.compiled_blocks_ok(),
                                reason="compiled blocks are captured from torch 2.5 on (the dump refuses them before)")


def _net(compiled: bool, backend: str = "aot_eager", fault: str | None = None) -> Net:
    torch.manual_seed(0)
    m = Net()
    if fault is not None:  # a x1.05 forward hook, traced into the block's graph
        m.get_submodule(fault).register_forward_hook(lambda mod, a, o: o * 1.05)
    if compiled:
        for i, b in enumerate(m.blocks):
            m.blocks[i] = torch.compile(b, backend=backend)
    return m


def _train(m: Net, out=None, steps: int = 3, level: str = "aten") -> list[torch.Tensor]:
    torch._dynamo.reset()
    return sgd_in_dump(m, m, out, steps, level=level)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_compiled_blocks_are_found_outermost_first():
    m = _net(True)
    assert [p for p, _ in compiled_blocks(m)] == ["blocks.0", "blocks.1", "blocks.2"]
    assert compiled_blocks(_net(False)) == []
    assert compiled_blocks(torch.compile(_net(False), backend="aot_eager")) == []  # a compiled model: not blocks


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_each_blocks_graphs_are_captured_with_its_path_and_the_numerics_stay_compiled(tmp_path, backend):
    plain = _train(_net(True, backend))
    m = _net(True, backend)
    with_tool = _train(m, tmp_path / "d")
    assert _same(plain, with_tool)  # bitwise: the compiled run's numerics, not an eager run's
    assert all(type(b).__name__ == "OptimizedModule" for b in m.blocks)  # the blocks are given back as they were
    assert not any(isinstance(b.__dict__.get("forward"), functools.partial) for b in m.blocks)  # our wrapper gone
    recs = [json.loads(line) for line in (tmp_path / "d" / "step1" / "rank0" / "records.jsonl").open()]
    compiled = [r for r in recs if (r.get("flags") or {}).get("compiled")]
    for phase in ("forward", "backward"):
        mods = {r["module"] for r in compiled if r["phase"] == phase}
        # each block's own records (a graph shared by the blocks gets the running block's path)
        assert {m for m in mods if m.endswith(".fc")} == {f"blocks.{i}.fc" for i in range(3)}, (phase, mods)
        assert not any("_orig_mod" in m for m in mods)
    eager = [r for r in recs if not (r.get("flags") or {}).get("compiled")]
    assert any(r["module"] == "head" and r["phase"] == "forward" for r in eager)  # the eager ops around them
    assert not any(r["module"].startswith("blocks.") and r["phase"] == "forward" for r in eager)
    header = json.loads((tmp_path / "d" / "step1" / "rank0" / "header.json").read_text())
    assert header["compile"]["graphs"]["forward"] >= 1


def test_compiled_blocks_compare_clean_against_eager_and_a_planted_fault_is_named_in_its_block(tmp_path):
    _train(_net(False), tmp_path / "eager")
    _train(_net(True), tmp_path / "blocks")
    clean = torchparity.compare(str(tmp_path / "eager"), str(tmp_path / "blocks"))
    assert clean.root_cause is None and not clean.summary.get("n_error")
    assert clean.summary.get("n_pass", 0) > 50  # the blocks' values were compared, not left one-sided
    # either way round: which dump is compiled is read from the step headers (a compiled dump has
    # eager records with inputs too: compared as the device dump, its records got no inputs)
    back = torchparity.compare(str(tmp_path / "blocks"), str(tmp_path / "eager"))
    assert back.summary["n_compared"] == clean.summary["n_compared"] and back.root_cause is None
    _train(_net(True, fault="blocks.1.ln"), tmp_path / "fault")
    rc = torchparity.compare(str(tmp_path / "eager"), str(tmp_path / "fault")).root_cause
    assert rc is not None and rc.step == 0 and rc.module.startswith("blocks.1"), rc


def test_api_level_refuses_compiled_blocks_at_start(tmp_path):
    with pytest.raises(CompiledModelError, match=r"compiled blocks \('blocks.0'"):
        torchparity.dump(tmp_path / "d", model=_net(True), level="api").start()
    assert not list(tmp_path.rglob("*.json"))  # refused before anything is written


def test_blocks_compiled_differently_are_refused_in_one_line(tmp_path):
    m = _net(False)
    m.blocks[0] = torch.compile(m.blocks[0], backend="aot_eager")
    m.blocks[1] = torch.compile(m.blocks[1], backend="inductor")
    with pytest.raises(CompiledModelError, match="compiled alike"):
        torchparity.dump(tmp_path / "d", model=m, level="aten").start()
    assert not list(tmp_path.rglob("*.json"))  # refused before anything is written


def test_without_shared_block_graphs_the_dump_refuses_compiled_blocks(tmp_path, monkeypatch):
    # torch 2.2-2.4 (parameters not graph inputs): one graph per block, past Dynamo's recompile
    # limit the last blocks would run eagerly under the capture, so the dump says it cannot
    dump_api = importlib.import_module("torchparity.dump.api")
    monkeypatch.setattr(dump_api, "compiled_blocks_ok", lambda: False)
    with pytest.raises(CompiledModelError, match="torch >= 2.5"):
        torchparity.dump(tmp_path / "d", model=_net(True), level="aten").start()


def test_op_level_tools_refuse_compiled_blocks_at_start_and_the_dump_finds_the_first_nan(tmp_path):
    m = _net(True)
    # online compare always; the NaN/Inf tracker before torch 2.9 (tests/online/test_naninf_compiled.py after)
    tools = [lambda: torchparity.CompareWithReference(model=m)] + \
        ([] if compiled_mod.COMPILED_MODULES_RUN else [lambda: torchparity.NanInfTracker(m)])
    for tool in tools:
        with pytest.raises(CompiledModelError, match=r"blocks are torch.compile'd \('blocks.0', 'blocks.1' and 1 more\)"):
            tool().start()
        assert not torchparity.op_stream().consumers, torchparity.op_stream().consumers
    with torch.no_grad():
        m.blocks[1]._orig_mod.fc.bias[0] = float("nan")  # a NaN made inside the second block's graph
    _train(m, tmp_path / "d", steps=1)
    df = torchparity.load_dump(tmp_path / "d")
    out = df[(df["io"] == "output") & (df["nan"] > 0)].sort_values(["step", "record_id"])
    assert out.iloc[0]["module"] == "blocks.1.fc" and out.iloc[0]["phase"] == "forward"


class PassThrough(nn.Module):
    """A block that also hands its input on (a residual, a cache): that output's autograd node is
    the previous block's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.fc(x)) + x, x


def test_a_block_handing_its_input_on_leaves_the_earlier_blocks_backward_its_own_path(tmp_path):
    torch.manual_seed(0)
    blocks = nn.ModuleList(torch.compile(PassThrough(), backend="aot_eager") for _ in range(3))

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = blocks

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)[0]
            return x[:, :4]

    m = Chain()
    _train(m, tmp_path / "d", steps=1)
    recs = [json.loads(line) for line in (tmp_path / "d" / "step0" / "rank0" / "records.jsonl").open()]
    bwd = {r["module"] for r in recs if (r.get("flags") or {}).get("compiled") and r["phase"] == "backward"}
    assert {f"blocks.{i}.fc" for i in range(3)} <= bwd, bwd


def test_a_module_level_dump_names_compiled_blocks_by_their_own_class(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _train(_net(True), tmp_path / "blocks", level="module")
    assert not [w for w in said if "global hooks" in str(w.message)]  # Dynamo's warning: untrue here
    _train(_net(False), tmp_path / "eager", level="module")
    df = torchparity.load_dump(tmp_path / "blocks")
    assert set(df.loc[df["module"].isin(["blocks.0", "blocks.1", "blocks.2"]), "module_class"]) == {"Block"}
    res = torchparity.compare(str(tmp_path / "eager"), str(tmp_path / "blocks"))
    assert res.root_cause is None and not [w for w in res.summary["warnings"] if "different ops" in w]
