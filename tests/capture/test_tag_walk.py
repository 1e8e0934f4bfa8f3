"""Backward attribution tags (module_tracker.tag_graph): the walk that skips a submodule call's
nodes (``walked``) tags every node as the full walk does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchparity.capture.module_tracker import ModuleTracker, tag_graph


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))  # the mul is the MLP's own op


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.mlp = torch.nn.LayerNorm(8), _MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x)) * 0.5


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block(), _Block()])
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        x = torch.tanh(x)  # between children
        return self.head(x).sum()


def _tags_both_ways(model: torch.nn.Module, run: Any) -> tuple[dict[str, tuple], dict[str, tuple], int]:
    """Tag one forward's nodes twice (key "full": every walk goes through submodule nodes; key
    "skip": walks skip them), return {node description: tag} for each and the node count."""
    walked: dict[int, Any] = {}
    tracker = ModuleTracker()
    tracker.want_seq = True
    tracker.add_root(model)

    def full(frame: Any, args: Any, kwargs: Any, output: Any) -> None:
        tag_graph(output, (frame.path, frame.cls), key="full", since=frame.seq0)

    def skip(frame: Any, args: Any, kwargs: Any, output: Any) -> None:
        tag_graph(output, (frame.path, frame.cls), key="skip", since=frame.seq0, walked=walked)
        if not tracker.stack:
            walked.clear()

    tracker.on_exit += [full, skip]
    with tracker:
        out = run()
    assert not walked  # emptied when the outermost module returned
    tags_full: dict[str, tuple] = {}
    tags_skip: dict[str, tuple] = {}
    todo, seen, alive = [out.grad_fn], set(), []
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        alive.append(node)
        try:
            meta = node.metadata
        except (AttributeError, RuntimeError):
            continue
        name = f"{node.name()}#{node._sequence_nr()}"
        tags_full[name] = meta.get("full")
        tags_skip[name] = meta.get("skip")
        todo.extend(fn for fn, _ in node.next_functions)
    return tags_full, tags_skip, len(seen)


def test_skipping_walk_tags_like_the_full_walk() -> None:
    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(3, 8, requires_grad=True)
    full, skip, n = _tags_both_ways(model, lambda: model(x))
    assert n > 30
    assert skip == full
    # the MLP's own mul and the net's own tanh are theirs, not a child's
    assert full[next(k for k in full if k.startswith("MulBackward") and full[k][0].endswith("mlp"))][1] == "_MLP"
    assert any(k.startswith("TanhBackward") and v == ("", "_Net") for k, v in full.items())


def test_skipping_walk_on_hf_llama() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (2, 8))
    full, skip, n = _tags_both_ways(model, lambda: model(input_ids=ids, labels=ids).loss)
    assert n > 100
    assert skip == full
    assert sum(1 for v in full.values() if v and v[0].endswith("self_attn")) > 0


def test_a_full_walked_dict_starts_again_and_tags_stay_the_same(monkeypatch) -> None:
    """An outermost module that never returns would grow ``walked`` by a call per module call:
    past its limit it is emptied, and a walk that misses a submodule's entry goes through the
    submodule's nodes, so the tags do not change."""
    from torchparity.capture import module_tracker

    monkeypatch.setattr(module_tracker, "_WALKED_LIMIT", 3)
    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(3, 8, requires_grad=True)
    full, skip, _ = _tags_both_ways(model, lambda: model(x))
    assert skip == full
