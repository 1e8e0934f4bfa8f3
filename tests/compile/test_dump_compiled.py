"""torchparity.dump(model=torch.compile(model), level="aten"): the compiled graphs are captured by the
compile backend inside the dump, the user's numerics stay those of the compiled run (docs/compile.md)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import torchparity
from tests.compile.conftest import sgd_in_dump
from torchparity.capture.compiled import COMPILED_DUMP_OK, COMPILED_MODULES_RUN, CompiledModelError

pytestmark = pytest.mark.skipif(not COMPILED_DUMP_OK, reason="torch 2.1: a compiled model is refused by the dump "
                                                             "(the compile backend needs torch >= 2.2)")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.act, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(self.act(self.ln(self.fc1(x)))), -1)


def _train(backend, out=None, steps: int = 3, mode: str = "statistics", compiled: bool = True):
    torch.manual_seed(0)
    m = Small()
    torch._dynamo.reset()
    return sgd_in_dump(m, torch.compile(m, backend=backend) if compiled else m, out, steps, mode=mode)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_model_keeps_its_numerics_and_its_graphs_are_captured_with_the_eager_ops(tmp_path, backend):
    plain = _train(backend)
    with_tool = _train(backend, tmp_path / "d")
    assert _same(plain, with_tool)  # bitwise: the compiled run's numerics, not an eager run's
    df = torchparity.load_dump(tmp_path / "d")
    flags = df["flags"].map(lambda f: (json.loads(f) if isinstance(f, str) else f) or {})
    comp = df[flags.map(lambda f: bool(f.get("compiled")))]
    assert sorted(comp.step.unique()) == [0, 1, 2]  # a step per optimizer step (step 3: the last clone())
    eager = df[~flags.map(lambda f: bool(f.get("compiled")))]
    # the compiled graphs, forward and backward, with module names as in an eager dump
    for step in (0, 1, 2):
        c = comp[comp.step == step]
        assert ({"fc1", "act", "fc2"} if backend == "inductor" else {"fc1", "ln", "act", "fc2"}) \
            <= set(c[c.phase == "forward"].module)
        # under Inductor, values it keeps in registers (ln forward, gelu backward) are not captured
        assert ({"fc1", "ln", "fc2"} if backend == "inductor" else {"fc1", "ln", "act", "fc2"}) \
            <= set(c[c.phase == "backward"].module)
    assert not df.module.fillna("").str.contains("_orig_mod").any()
    # the eager ops around the compiled call: the loss and the optimizer, in the same dump
    assert {"forward", "backward", "optimizer"} <= set(eager[eager.step == 0].phase)
    assert "aten.mse_loss.default" in set(eager.op) or "aten.mean.default" in set(eager.op)
    # no eager capture of the model's own ops (it did not run eagerly): no eager addmm
    assert "aten.addmm.default" not in set(eager.op)
    ids = df[df.step == 0].drop_duplicates("record_id").record_id
    assert ids.is_unique and sorted(ids) == list(range(len(ids)))
    header = json.loads((tmp_path / "d" / "step0" / "rank0" / "header.json").read_text())
    assert header["compile"]["graphs"] == {"forward": 1, "backward": 1}


def test_md5_of_a_compiled_graph_equals_the_eager_runs_md5(tmp_path):
    _train("aot_eager", tmp_path / "c", steps=1, mode="md5")
    _train(None, tmp_path / "e", steps=1, mode="md5", compiled=False)
    c = torchparity.load_dump(tmp_path / "c")
    e = torchparity.load_dump(tmp_path / "e")
    key = ["module", "phase", "op", "call_index"]
    c = c[(c.io == "output") & c.module.isin(["fc1", "ln", "act", "fc2"])]
    e = e[(e.io == "output") & (e.arg == "0")]
    assert c.md5.notna().all() and len(c) >= 8
    merged = c.merge(e, on=key, suffixes=("_c", "_e"))
    assert len(merged) >= 8  # forward and backward nodes paired with eager ops
    assert (merged.md5_c == merged.md5_e).all(), merged[key + ["md5_c", "md5_e"]]


def test_tensor_mode_saves_the_compiled_values(tmp_path):
    _train("aot_eager", tmp_path / "c", steps=1, mode="tensor")
    c = torchparity.load_dump(tmp_path / "c")
    fc1 = c[(c.module == "fc1") & (c.phase == "forward") & (c.op == "aten.addmm.default")]
    assert len(fc1) == 1 and isinstance(fc1.file.iloc[0], str) and fc1.file.iloc[0] != "pending"


def test_a_backend_that_cannot_be_wrapped_is_refused_in_one_line(tmp_path):
    def my_backend(gm, ex):
        return gm.forward

    model = torch.compile(Small(), backend=my_backend)
    with pytest.raises(CompiledModelError, match=r"backend 'my_backend'.*'inductor', 'aot_eager'") as ei:
        torchparity.dump(tmp_path / "d", level="aten", model=model).start()
    assert "\n" not in str(ei.value)
    assert not any((tmp_path / "d").glob("step*"))


def test_the_api_level_refuses_a_compiled_model_naming_the_aten_level(tmp_path):
    model = torch.compile(Small(), backend="aot_eager")
    with pytest.raises(CompiledModelError, match="use level='aten'|Use level='aten'"):
        torchparity.dump(tmp_path / "d", level="api", model=model).start()


def test_the_users_own_global_hooks_still_fire_in_the_compiled_call_and_the_tools_are_back_after(tmp_path):
    seen = []
    h = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
    try:
        _train("aot_eager", tmp_path / "d", steps=1)
    finally:
        h.remove()
    assert "Linear" in seen  # the user's hook ran for the compiled model's modules
    mm = torch.nn.modules.module
    assert not mm._global_forward_hooks and not mm._global_forward_pre_hooks  # the dump's hooks are gone


def test_device_stats_of_the_dump_batch_the_compiled_graphs_statistics_too(tmp_path, monkeypatch):
    """torchparity.dump(device_stats=True) runs the accelerator path on the CPU for the eager ops;
    the compiled graphs' values go through a StatBatcher too (counted), the numerics stay bitwise
    and the statistics agree with the host path's."""
    from torchparity.capture.stat_batch import StatBatcher

    added = []
    real_add = StatBatcher.add
    monkeypatch.setattr(StatBatcher, "add", lambda self, v: (added.append(v.numel()), real_add(self, v))[1])

    def run(out, device_stats):
        torch.manual_seed(0)
        m = Small()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch._dynamo.reset()
        c = torch.compile(m, backend="aot_eager")
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        with torchparity.dump(out, model=c, level="aten", device_stats=device_stats):
            for _ in range(2):
                opt.zero_grad()
                ((c(x) - 1) ** 2).mean().backward()
                opt.step()
        df = torchparity.load_dump(out)
        flags = df["flags"].map(lambda f: (json.loads(f) if isinstance(f, str) else f) or {})
        return df[flags.map(lambda f: bool(f.get("compiled")))].reset_index(drop=True), \
            [p.detach().clone() for p in m.parameters()]

    host, p_host = run(tmp_path / "h", False)
    n_host = len(added)
    batched, p_batched = run(tmp_path / "b", True)
    assert _same(p_host, p_batched)
    assert len(added) - n_host >= len(batched) > 10  # every compiled value (and the eager ops') batched
    assert list(host.name) == list(batched.name)
    assert (host["max"] == batched["max"]).all() and (host["min"] == batched["min"]).all()
    assert ((host["norm"] - batched["norm"]).abs() <= 1e-5 * host["norm"].abs() + 1e-7).all()


class _LogNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.log(torch.relu(self.fc1(x)) - 0.05))  # NaN where relu < 0.05


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_first_nan_of_a_compiled_model_is_found_in_its_dump_by_record_id(tmp_path, backend):
    """The dump's NaN counts name the first op that made a NaN in a compiled model, in execution
    order (record ids; the recipe of docs/compile.md); the NaN/Inf tracker points there (its
    refusal before torch 2.9, its finding's note after: the compiled model runs under it)."""
    import shutil

    if backend == "inductor" and not (shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")):
        pytest.skip("Inductor needs a C++ compiler on the CPU")
    torch.manual_seed(0)
    m = _LogNet()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch._dynamo.reset()
    c = torch.compile(m, backend=backend)
    with torchparity.dump(tmp_path / "d", model=c, level="aten"):
        opt.zero_grad()
        c(torch.randn(8, 16)).square().mean().backward()
        opt.step()
    out = torchparity.load_dump(tmp_path / "d")
    out = out[(out.io == "output") & (out.nan > 0)].sort_values(["step", "record_id"])
    first = out.iloc[0]
    assert (first.op, first.phase, first.step) == ("aten.log.default", "forward", 0)
    if not COMPILED_MODULES_RUN:  # torch < 2.9: the tracker refuses the compiled model, naming the dump query
        with pytest.raises(CompiledModelError, match=r"level='aten'.*nan > 0"):
            torchparity.NanInfTracker(c).start()
        return
    with torchparity.NanInfTracker(c) as tracker:  # it runs compiled: the NaN is told as entered, the dump named
        c(torch.randn(8, 16)).square().mean().backward()
    assert tracker.findings and "torchparity.dump(DIR, model=model, level='aten')" in tracker.findings[0].note


def test_a_compiled_models_dump_says_what_it_left_out_and_no_unseen_compiled_function(tmp_path, capsys):
    """The headers of a compiled model's dump say what of its graphs was not captured, and
    `torchparity info` shows it; they say nothing of compiled functions outside the model while
    none ran (they said so whenever Dynamo had compiled anything, the dumped model included);
    a compiled loss outside the model is said."""
    from tests.cli.test_info import run_cli

    _train("inductor", tmp_path / "d", steps=2)
    header = json.loads((tmp_path / "d" / "step1" / "rank0" / "header.json").read_text())
    assert "compiled_functions" not in header
    assert header["compile"]["graphs"] == {"forward": 1, "backward": 1}
    code, text = run_cli(["info", str(tmp_path / "d")], capsys)
    assert code == 0 and "compiled: torch.compile (inductor), captured in graph (graphs: 1 forward, 1 backward)" in text
    assert "not captured: " in text and "Inductor may keep in registers" in text and "compiled function" not in text
    assert text.count("compiled: torch.compile") == 1  # said once while it stays the same

    @torch.compile(backend="eager")
    def loss_of(out: torch.Tensor) -> torch.Tensor:
        return (out ** 2).mean()

    torch.manual_seed(0)
    m = Small()
    run = torch.compile(m, backend="inductor")
    with torchparity.dump(tmp_path / "e", model=run, level="aten"):
        loss_of(run(torch.randn(4, 8))).backward()
    header = json.loads((tmp_path / "e" / "step0" / "rank0" / "header.json").read_text())
    assert "outside a model the dump captures" in header["compiled_functions"]
