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
    # (ln's output is not captured: Inductor keeps it in registers, fused into gelu; capturing it
    # would make Inductor store it and change the numerics - docs/compile.md)
    assert fwd == [("fc1", "aten.addmm.default"), ("act", "aten.gelu.default"), ("fc2", "aten.addmm.default"),
                   ("", "aten._softmax.default")]
    gelu = next(r for r in recs if r["op"] == "aten.gelu.default")
    assert gelu["name"] == "Aten.gelu.0.forward" and gelu["flags"]["graph_nodes"] > 1
    assert gelu["tensors"][0]["shape"] == [4, 16]
    bwd = [(r["module"], r["op"]) for r in recs if r["phase"] == "backward"]
    assert ("ln", "aten.native_layer_norm_backward.default") in bwd
    assert len(bwd) == len(set(r["name"] for r in recs if r["phase"] == "backward"))
    lnb = next(r for r in recs if r["op"] == "aten.native_layer_norm_backward.default")
    assert lnb["tensors"][0]["shape"] == [4, 16] and lnb["flags"]["graph_nodes"] > 3  # grad_input, not grad_weight
    assert not any(r["op"].startswith(("aten.var_mean", "aten.rsqrt", "aten.erf", "prims.")) for r in recs)


def test_inductor_vs_eager_compare_no_false_divergence(tmp_path, eager_dump):
    _train(compile_backend(tmp_path / "c"))
    res = torchparity.compare(eager_dump, tmp_path / "c", output_dir=tmp_path / "out")
    s = res.summary
    n_comp = len(_records(tmp_path / "c"))
    paired = res.rows[res.rows["match"] != "unmatched"]
    # every compiled record paired with its eager op; inputs traced to their producers compared too
    assert s["n_unmatched_bench"] == 0 and paired["bench_record_id"].nunique() == n_comp
    assert (paired["io"] == "input").sum() >= 6
    assert s["n_error"] == 0 and s["n_warning"] == 0 and not s["diverged"] and res.root_cause is None, res.rows.loc[res.rows["verdict"] == "warning", ["device_name", "bench_name", "io", "arg", "reason"]].to_string()


@pytest.mark.parametrize("module, phase", [("fc2", "forward"), ("ln", "backward")])
def test_planted_fault_in_graph_is_named(tmp_path, eager_dump, module, phase):
    cap = compile_backend(tmp_path / "c", graph_pass=scale_module_output(module, phase, 1.05))
    _train(cap)
    res = torchparity.compare(eager_dump, tmp_path / "c", output_dir=tmp_path / "out")
    assert res.summary["diverged"]
    rc = res.root_cause
    assert rc is not None and rc.module == module and rc.phase == phase, rc


@pytest.mark.slow
def test_hf_llama_inductor_vs_eager_no_false_divergence(tmp_path):
    """A random-init HF Llama (tiny) compiled with Inductor vs its eager aten dump: aligned, no divergence."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=64, max_position_embeddings=64,
                                   attn_implementation="eager")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    def run(backend=None) -> float:
        torch.manual_seed(0)
        m = transformers.LlamaForCausalLM(cfg)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch._dynamo.reset()
        fn = torch.compile(m, backend=backend) if backend is not None else m
        if backend is not None:
            backend.attach(opt)
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        if backend is not None:
            backend.close()
        return loss.item()

    with torchparity.dump(tmp_path / "eager", level="aten"):
        run()
    run(compile_backend(tmp_path / "comp"))
    res = torchparity.compare(tmp_path / "eager", tmp_path / "comp", output_dir=tmp_path / "out")
    s = res.summary
    n_comp = len(_records(tmp_path / "comp"))
    paired = res.rows[res.rows["match"] != "unmatched"]
    assert paired["bench_record_id"].nunique() > 0.6 * n_comp  # most compiled records found their eager op
    assert {"forward", "backward"} <= set(res.rows.loc[res.rows["match"] != "unmatched", "phase"])
    assert s["n_error"] == 0 and s["n_warning"] == 0 and not s["diverged"] and res.root_cause is None, res.rows.loc[res.rows["verdict"] == "warning", ["device_name", "bench_name", "io", "arg", "reason"]].to_string()


class Masked(nn.Module):
    """Causal-masked attention scores: the softmax's eager input holds -inf (the mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ x.transpose(-1, -2)
        mask = torch.full((x.shape[-2], x.shape[-2]), float("-inf")).triu(1)
        return torch.softmax(s + mask, -1) @ x


def test_masked_softmax_input_is_compared_through_its_producer(tmp_path):
    """The compiled softmax has no input rows of its own: its input is the paired ``add``'s output
    (-inf on both sides), not an eager-only tensor with -inf (an overflow false alarm)."""
    def run(backend=None) -> None:
        torch.manual_seed(0)
        m = Masked()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch._dynamo.reset()
        f = torch.compile(m, backend=backend) if backend is not None else m
        if backend is not None:
            backend.attach(opt)
        f(torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))).pow(2).mean().backward()
        opt.step()
        if backend is not None:
            backend.close()

    with torchparity.dump(tmp_path / "eager", level="aten"):
        run()
    run(compile_backend(tmp_path / "comp"))
    res = torchparity.compare(tmp_path / "eager", tmp_path / "comp", output_dir=tmp_path / "out")
    assert res.summary["n_error"] == 0 and not res.summary["diverged"], res.rows[res.rows["verdict"] == "error"]
    sm = res.rows[(res.rows["op"] == "aten._softmax.default") & (res.rows["match"] != "unmatched")]
    assert len(sm) and (sm["verdict"] == "pass").any()  # the softmax itself was compared


class Reshaping(nn.Module):
    """A linear on 3-d input (eager: addmm, then a view back to 3-d) followed by GELU: the eager
    GELU reads a view of the addmm's output, a value the compiled graph does not record."""

    def __init__(self) -> None:
        super().__init__()
        self.dense, self.act, self.head = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.dense(x)))


def _reshaping(backend, fault: bool) -> None:
    torch.manual_seed(0)
    m = Reshaping()
    if fault:  # a forward hook: inside the compiled graph, fused into the next kernel
        m.dense.register_forward_hook(lambda mod, i, o: o * 1.05)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch._dynamo.reset()
    run = torch.compile(m, backend=backend) if backend is not None else m
    if hasattr(backend, "attach"):
        backend.attach(opt)
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
    loss = run(x).square().mean()
    loss.backward()
    opt.step()
    if hasattr(backend, "close"):
        backend.close()


def test_an_eager_input_read_through_a_view_is_compared(tmp_path):
    """New-user check (session 16): a x1.05 hook on BERT's intermediate dense, compiled against
    eager, blamed a LayerNorm backward: the eager GELU's input is a view of the addmm's output, so
    it had no compiled counterpart and no forward op was judged. The reshape is followed."""
    with torchparity.dump(tmp_path / "eager", level="aten"):
        _reshaping(None, fault=False)
    _reshaping(compile_backend(tmp_path / "comp", inner="eager"), fault=True)
    rc = torchparity.compare(tmp_path / "eager", tmp_path / "comp").root_cause
    assert rc is not None and rc.phase == "forward" and rc.module == "act" and rc.op == "aten.gelu.default", rc
    _reshaping(compile_backend(tmp_path / "clean", inner="eager"), fault=False)
    res = torchparity.compare(tmp_path / "eager", tmp_path / "clean")
    assert res.root_cause is None
    gelu_in = res.rows[(res.rows["op"] == "aten.gelu.default") & (res.rows["io"] == "input")]
    assert (gelu_in["match"] != "unmatched").all() and len(gelu_in), gelu_in  # its input is compared


def test_compiled_against_compiled_blames_the_first_divergence(tmp_path):
    """Two compiled runs: their records hold outputs only. Such a record's input error is the
    largest error before it (it was zero, as for a factory op: a bf16 Llama's x1.05 down_proj fault
    that stayed under the floor in the residual stream was blamed on model.norm's rsqrt)."""
    _reshaping(compile_backend(tmp_path / "bad", inner="eager"), fault=True)
    _reshaping(compile_backend(tmp_path / "good", inner="eager"), fault=False)
    rc = torchparity.compare(tmp_path / "bad", tmp_path / "good").root_cause
    assert rc is not None and rc.phase == "forward" and rc.module in ("dense", "act"), rc


def test_error_before_is_the_running_maximum_in_execution_order():
    import numpy as np

    from torchparity.compare.compiled_inputs import error_before as _error_before

    got = _error_before(np.array([0.5, np.nan, 0.1, 0.3]), np.array([3, 0, 1, 2]))
    assert got.tolist() == [0.3, 0.0, 0.0, 0.1]


class TanhGelu(nn.Module):
    """GPT-2's GELU as its code writes it: eager records mul, pow, add, tanh...; Inductor fuses
    them into one kernel and stores the last mul only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


def test_an_eager_op_whose_inputs_were_fused_away_is_judged(tmp_path):
    """New-user check (session 16): GPT-2 with a x1.05 hook on its MLP's c_fc, Inductor against
    eager: the last mul of the GELU is the first stored value after the fault, but its eager
    inputs (the fused mul/pow/tanh chain) have no compiled counterpart, so it was never judged
    and a backward op in step 1 was blamed. Its input error is now traced back through them."""
    def run(backend, fault, path=None):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), TanhGelu(), nn.Linear(16, 4))
        if fault:
            m[0].register_forward_hook(lambda mod, i, o: o * 1.05)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch._dynamo.reset()
        r = torch.compile(m, backend=backend) if backend is not None else m
        if hasattr(backend, "attach"):
            backend.attach(opt)
        loss = r(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).square().mean()
        loss.backward()
        opt.step()
        if hasattr(backend, "close"):
            backend.close()

    with torchparity.dump(tmp_path / "eager", level="aten"):
        run(None, False)
    run(compile_backend(tmp_path / "comp"), True)
    for a, b in (("eager", "comp"), ("comp", "eager")):
        rc = torchparity.compare(tmp_path / a, tmp_path / b).root_cause
        assert rc is not None and rc.phase == "forward" and rc.module == "1" and rc.step == 0, (a, rc)


@pytest.mark.slow
def test_hf_bert_bf16_inductor_vs_eager_two_steps_no_false_divergence(tmp_path):
    """The zoo's BERT in bf16, 2 steps, Inductor against eager (the usercheck's compile check):
    its key-weight gradient reads a compared activation and a gradient no compiled value holds
    (~0 by cancellation under softmax). Judged against the compared input alone it was blamed
    (x17.4, step 1) once the reshapes were followed; the other input's error is traced now."""
    import sys
    from pathlib import Path as _P

    sys.path.insert(0, str(_P(__file__).resolve().parents[1] / "zoo"))
    import torch._inductor.config as iconf
    import zoo_models as zm

    pytest.importorskip("transformers")
    spec = zm.ZOO["bert"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with iconf.patch(fallback_random=True):
            torch._dynamo.reset()
            on = zm.Trainer(spec, "bf16")
            on.model = torch.compile(on.model)
            with torchparity.dump(str(tmp_path / "compiled"), model=on.model, level="aten"):
                on.train(2)
            eager = zm.Trainer(spec, "bf16")
            with torchparity.dump(str(tmp_path / "eager"), model=eager.model, level="aten"):
                eager.train(2)
    finally:
        torch.set_num_threads(threads)
    res = torchparity.compare(str(tmp_path / "eager"), str(tmp_path / "compiled"))
    assert res.root_cause is None and not res.summary["n_error"], res.root_cause and res.root_cause.reason
