"""No false alarm on clean real models (tiny random-init Hugging Face Llama with eager attention
and BERT, fp32 and bf16, 10 steps), and tool on == tool off on them."""

from __future__ import annotations

import pytest
import torch

import torchparity

transformers = pytest.importorskip("transformers")


def _llama(dtype: torch.dtype) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _bert(dtype: torch.dtype) -> torch.nn.Module:
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg).to(dtype)


def _batches(n: int = 10) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 64, (2, 8), generator=g)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 6:] = 0
        out.append({"input_ids": ids, "labels": ids, "attention_mask": mask})
    return out


def _run(make, dtype, tmp_path, watch: bool):
    model = make(dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(b):
        loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    torch.manual_seed(5)  # dropout
    if not watch:
        return model, [step(b).item() for b in _batches()], None
    with torchparity.watch(model, opt, output_dir=tmp_path / "w", every=4) as w:
        losses = [w.run(step, b).item() for b in _batches()]
    return model, losses, w


@pytest.mark.parametrize("make", [_llama, _bert], ids=["llama", "bert"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_clean_model_no_false_alarm_and_same_numerics(make, dtype, tmp_path):
    ref_model, ref_losses, _ = _run(make, dtype, tmp_path, watch=False)
    model, losses, w = _run(make, dtype, tmp_path, watch=True)
    assert w.triggers == [] and w.step == 10
    assert losses == ref_losses
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
