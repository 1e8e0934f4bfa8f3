"""Module and parameter attribution on a real model (tiny random-init HF Llama, eager attention).

Issue 14: ops a module runs between its children (the MLP's ``mul`` before ``down_proj``) had no
module in backward; code in a forward hook was attributed to the parent module; optimizer ops did
not say which parameter they update. The loss stays bitwise the same with the dump on and off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import torchparity

transformers = pytest.importorskip("transformers")

_LOSS_OPS = {"aten.nll_loss_backward.default", "aten._log_softmax_backward_data.default", "aten.view.default"}


def _llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg)


def _hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return out * 1.0  # exact: the numerics do not change


def _train(path: Path | None, steps: int = 1, foreach: bool = False) -> list[torch.Tensor]:
    model = _llama()
    model.model.layers[1].mlp.act_fn.register_forward_hook(_hook)
    model.lm_head.register_forward_hook(_hook)  # a child of the root
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    x = torch.randint(0, 64, (2, 8))
    losses = []
    dumper = torchparity.dump(str(path), level="aten") if path is not None else None
    if dumper is not None:
        dumper.start()
    try:
        for _ in range(steps):
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    finally:
        if dumper is not None:
            dumper.stop()
    return losses


def _records(path: Path, step: int = 0) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def llama_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[torch.Tensor]]:
    path = tmp_path_factory.mktemp("llama") / "d"
    return path, _train(path, steps=2)


def test_losses_bitwise_with_the_dump_on_and_off(llama_dump) -> None:
    _, on = llama_dump
    off = _train(None, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(on, off))


def test_every_backward_op_of_a_decoder_layer_has_its_module(llama_dump) -> None:
    recs = _records(llama_dump[0])
    bwd = [r for r in recs if r["phase"] == "backward"]
    orphans = {r["op"] for r in bwd if r["module"] == ""}
    assert orphans <= _LOSS_OPS, f"backward ops with no module: {sorted(orphans - _LOSS_OPS)}"
    for layer in (0, 1):
        mlp = [r["op"] for r in bwd if r["module"] == f"model.layers.{layer}.mlp"]
        assert "aten.mul.Tensor" in mlp, "the MLP's gate*up product (run between its children) is the MLP's"


def test_a_forward_hook_belongs_to_the_hooked_module(llama_dump) -> None:
    recs = _records(llama_dump[0])
    fwd_scalar_mul = [r for r in recs if r["phase"] == "forward" and r["op"] == "aten.mul.Tensor"
                      and any(t["kind"] == "scalar" and t["value"] == 1.0 for t in r["tensors"])]
    hooked, parents = {"model.layers.1.mlp.act_fn", "lm_head"}, {"model.layers.1.mlp", ""}
    fwd_modules = {r["module"] for r in fwd_scalar_mul}
    assert hooked <= fwd_modules and not fwd_modules & parents, fwd_modules
    bwd_modules = {r["module"] for r in recs if r["phase"] == "backward" and r["op"] == "aten.mul.Tensor"
                   and any(t["kind"] == "scalar" and t["value"] == 1.0 for t in r["tensors"])}
    assert hooked <= bwd_modules and not bwd_modules & parents, bwd_modules


def test_optimizer_ops_name_their_parameter(llama_dump) -> None:
    for step in (0, 1):
        opt = [r for r in _records(llama_dump[0], step) if r["phase"] == "optimizer"]
        upd = [r for r in opt if r["op"].startswith("aten.addcdiv_")]
        names = [r["flags"].get("param") for r in upd]
        assert names[:2] == ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
        assert len(set(names)) == len(names) == sum(1 for _ in _llama().parameters())
    # from the second step on (optimizer state exists), every optimizer op is named
    assert all("param" in r["flags"] for r in _records(llama_dump[0], 1) if r["phase"] == "optimizer")


def test_foreach_optimizer_ops_name_each_list_element(tmp_path: Path) -> None:
    _train(tmp_path / "d", steps=1, foreach=True)
    opt = [r for r in _records(tmp_path / "d") if r["phase"] == "optimizer"]
    upd = next(r for r in opt if r["op"].startswith("aten._foreach_addcdiv_"))
    names = [n for n, _ in _llama().named_parameters()]
    assert upd["flags"]["params"] == names
