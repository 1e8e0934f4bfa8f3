"""Real models whose kernels hand back memory that holds no values (issue 14).

* ``nn.LSTM`` on the CPU runs ``aten.mkldnn_rnn_layer``, whose 4th result is a uint8 workspace
  (uninitialised padding, laid out for the kernel and dtype) that ``mkldnn_rnn_layer_backward``
  reads back: two identical aten dumps "diverged" on it.
* MoE routers (Qwen2-MoE, Mixtral) do ``inv = empty_like(perm); inv[perm] = arange(...)``: the
  destination of the in-place ``index_put_`` was measured as an input while it was still
  uninitialised memory, and the compare blamed ``empty_like``.

Both are described in the dump (dtype, shape) and never measured; the record says why in
``flags["unmeasured"]``. Each model also keeps its loss bitwise with the dump on and off.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import torchparity
from torchparity.compare.api import compare


class RNNLM(torch.nn.Module):
    """A tiny recurrent language model: embedding -> 2-layer LSTM/GRU -> linear head."""

    def __init__(self, kind: str = "LSTM", hidden: int = 32, vocab: int = 50) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.rnn = getattr(torch.nn, kind)(hidden, hidden, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


def _rnn_step(kind: str, dtype: torch.dtype, ctx: Any = None) -> torch.Tensor:
    torch.manual_seed(0)
    model = RNNLM(kind).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 50, (2, 8))
    with ctx or contextlib.nullcontext():
        loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
    return loss.detach()


def _moe_step(ctx: Any = None) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                      max_position_embeddings=64)
    model = transformers.Qwen2MoeForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 8))
    with ctx or contextlib.nullcontext():
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
    return loss.detach()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()]


def _two_dumps(tmp_path: Path, step: Callable[[Any], torch.Tensor], **options: Any) -> tuple[Path, Path]:
    """Dump two identical runs; the loss is bitwise the one of a run without the tool."""
    off = step(None)
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        on = step(torchparity.dump(str(d), level="aten", **options))
        assert torch.equal(on, off), "the dump changed the loss"
    return a, b


def _assert_agree(a: Path, b: Path) -> None:
    s = compare(str(a), str(b)).summary
    assert not s["diverged"] and s["n_error"] == 0 and s["n_warning"] == 0, s["first_divergence"]
    assert s["n_not_compared"] == 0 and s["complete"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_lstm_workspace_is_described_not_measured_and_identical_dumps_agree(tmp_path: Path, dtype: torch.dtype) -> None:
    a, b = _two_dumps(tmp_path, lambda ctx: _rnn_step("LSTM", dtype, ctx))
    recs = _records(a)
    fwd = [r for r in recs if r["op"] == "aten.mkldnn_rnn_layer.default"]
    bwd = [r for r in recs if r["op"] == "aten.mkldnn_rnn_layer_backward.default"]
    assert len(fwd) == 2 and len(bwd) == 2
    for r in fwd:
        ws = next(t for t in r["tensors"] if t["io"] == "output" and t["arg"] == "3")
        assert ws["dtype"] == "uint8" and ws["shape"] and "stats" not in ws and "md5" not in ws
        assert r["flags"]["unmeasured"] == {"output.3": "kernel workspace"}
        assert all("stats" in t for t in r["tensors"] if t["io"] == "output" and t["arg"] != "3")
    for r in bwd:
        ws = next(t for t in r["tensors"] if t["io"] == "input" and t["arg"] == "22")  # schema arg 'workspace'
        assert ws["dtype"] == "uint8" and "stats" not in ws
        assert r["flags"]["unmeasured"] == {"input.22": "kernel workspace"}
    _assert_agree(a, b)


def test_lstm_workspace_md5_mode_agrees(tmp_path: Path) -> None:
    a, b = _two_dumps(tmp_path, lambda ctx: _rnn_step("LSTM", torch.float32, ctx), mode="md5")
    _assert_agree(a, b)


def test_gru_identical_dumps_agree(tmp_path: Path) -> None:
    a, b = _two_dumps(tmp_path, lambda ctx: _rnn_step("GRU", torch.float32, ctx))
    _assert_agree(a, b)


def test_moe_empty_like_destination_is_not_measured_and_identical_dumps_agree(tmp_path: Path) -> None:
    a, b = _two_dumps(tmp_path, _moe_step)
    recs = _records(a)
    puts = [r for r in recs if r["op"].startswith("aten.index_put_") and "unmeasured" in r.get("flags", {})]
    assert puts, "the router's index_put_ into empty_like memory is flagged"
    for r in puts:
        dst = next(t for t in r["tensors"] if t["io"] == "input" and t["arg"] == "0")
        assert "stats" not in dst and r["flags"]["unmeasured"]["input.0"] == "uninitialised memory"
        out = next(t for t in r["tensors"] if t["io"] == "output")
        assert "stats" in out, "once written, the destination holds values and is measured"
    # empty_like's own result is never a value either; nothing else is left unmeasured
    for r in recs:
        for why in r.get("flags", {}).get("unmeasured", {}).values():
            assert why in ("uninitialised memory", "overwritten by the op", "out= buffer"), (r["name"], why)
    _assert_agree(a, b)


def test_written_or_reallocated_storage_is_measured_again(tmp_path: Path) -> None:
    """After the first write (or a fresh tensor in the same memory), values are measured."""
    with torchparity.dump(str(tmp_path / "d"), level="aten") as d:
        buf = torch.empty(6)
        buf.add_(0)  # reads garbage: not measured as an input
        buf.fill_(2.0)
        (buf * 3).sum()
        d.step()
    recs = _records(tmp_path / "d")
    add = next(r for r in recs if r["op"].startswith("aten.add_"))
    assert "stats" not in next(t for t in add["tensors"] if t["io"] == "input" and t["arg"] == "0")
    mul = next(r for r in recs if r["op"] == "aten.mul.Tensor")
    assert next(t for t in mul["tensors"] if t["io"] == "input" and t["arg"] == "0")["stats"]["max"] == 2.0


def test_uninit_storages_bookkeeping() -> None:
    from torchparity.capture.uninit import UninitStorages

    u = UninitStorages()
    t = torch.empty(4)
    assert not u.holds(t)
    u.mark([t])
    assert u.holds(t) and u.holds(t.view(2, 2)) and not u.holds(torch.zeros(4))
    u.written([t[1:]])  # any write through a view of the storage
    assert not u.holds(t) and not u
    u.mark([torch.empty(0)])  # an empty tensor has no memory to track
    assert not u
