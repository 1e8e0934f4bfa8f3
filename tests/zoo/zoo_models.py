"""The model zoo: tiny random-init models of real architectures, and one training step for each.

Every model is built from a ``transformers`` config class (no download) or from plain torch,
with fixed seeds, hidden size 32-128, 2 layers and a few tokens, so that one training step
(forward, loss, backward, AdamW step) takes well under a second on a CPU core.

Precisions (:data:`PRECISIONS`):

* ``fp32``: the model as built;
* ``bf16``: the same initial weights cast to bfloat16 (``model.to(torch.bfloat16)``), inputs too;
* ``fp16``: the fp32 model run under ``torch.autocast("cpu", dtype=torch.float16)`` with a
  ``torch.amp.GradScaler("cpu")`` (torch >= 2.4 supports float16 CPU autocast).

Dropout is switched off in the ``transformers`` configs (so that a bf16 and an fp32 run draw the
same random numbers and compare meaningfully); the plain CNN keeps a ``Dropout`` and the seed is
reset before every step, so two runs draw identical masks (bf16 and fp32 masks agree on the CPU).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchparity.compat.amp import backward_and_step

PRECISIONS = ("fp32", "bf16", "fp16")
VOCAB = 128
BATCH, SEQ = 2, 8


@dataclass
class ZooSpec:
    """One architecture of the zoo and where its planted faults go.

    ``fwd_module`` / ``bwd_module``: a Linear whose matmul gets the forward / backward fault;
    ``softmax_module``: the module whose softmax gets a fault (``None``: no aten softmax, e.g.
    sdpa attention); ``nan_module`` + ``nan_op``: where a NaN is planted by a dispatch mode
    (the op must run inside that module in forward); ``hook_module``: a module whose forward
    output gets ``out[..., 3] = nan`` in a forward hook. ``mlp_module``: a module whose backward
    gets one extra ``clone`` on the device side.
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], dict[str, torch.Tensor]]
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    fwd_module: str
    bwd_module: str
    softmax_module: str | None
    nan_module: str
    nan_op: str
    hook_module: str
    mlp_module: str
    notes: str = ""
    #: precision -> why this model cannot run in it here (cells in that precision are ``n/a``)
    unsupported: dict[str, str] = field(default_factory=dict)


# ---- batches ---------------------------------------------------------------------------------

def _tokens(seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def lm_batch() -> dict[str, torch.Tensor]:
    ids = _tokens()
    return {"input_ids": ids, "labels": ids.clone()}


def mlm_batch() -> dict[str, torch.Tensor]:
    """BERT masked LM with a padding mask: the second sequence has 3 padding tokens."""
    ids = _tokens()
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.clone().masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def seq2seq_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": _tokens(7), "labels": _tokens(8)}


def image_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 10, (BATCH,), generator=g)}


def hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss.float()


# ---- transformers models ---------------------------------------------------------------------

def _llama(attn: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation=attn)
        return LlamaForCausalLM(cfg)
    return build


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                     attn_implementation="eager")
    return GPT2LMHeadModel(cfg)


def _mistral() -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        sliding_window=None, attn_implementation="eager")
    return MistralForCausalLM(cfg)


def _qwen2_moe() -> nn.Module:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, attn_implementation="eager")
    return Qwen2MoeForCausalLM(cfg)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertForMaskedLM(cfg)


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                   num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    return T5ForConditionalGeneration(cfg)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, num_labels=10, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return ViTForImageClassification(cfg)


# ---- plain torch models ----------------------------------------------------------------------

class SmallCNN(nn.Module):
    """Two conv blocks with BatchNorm, ReLU and Dropout, then a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.act2 = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(32, 10)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.conv1(pixel_values)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.drop(x.mean(dim=(2, 3)))
        return self.head(x)


class RNNLM(nn.Module):
    """Embedding, a 2-layer LSTM or GRU, a linear head."""

    def __init__(self, cell: str = "lstm") -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(32, 64, num_layers=2, batch_first=True)
        self.proj = nn.Linear(64, 64)
        self.act = nn.GELU()
        self.head = nn.Linear(64, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(input_ids))
        return self.head(self.act(self.proj(h)))


def cnn_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["pixel_values"]).float(), batch["labels"])


def rnn_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), batch["labels"].reshape(-1))


# ---- the zoo ---------------------------------------------------------------------------------

def _decoder(name: str, build: Callable[[], nn.Module], softmax: str | None, **kw: Any) -> ZooSpec:
    base = dict(name=name, build=build, batch=lm_batch, loss=hf_loss,
                fwd_module="model.layers.1.mlp.down_proj", bwd_module="model.layers.1.mlp.up_proj",
                softmax_module=softmax, nan_module="model.layers.1.mlp.act_fn", nan_op="aten.silu",
                hook_module="model.layers.1.mlp.act_fn", mlp_module="model.layers.1.mlp")
    base.update(kw)
    return ZooSpec(**base)  # type: ignore[arg-type]


ZOO: dict[str, ZooSpec] = {s.name: s for s in [
    _decoder("llama-eager", _llama("eager"), "model.layers.1.self_attn"),
    _decoder("llama-sdpa", _llama("sdpa"), None),
    _decoder("mistral", _mistral, "model.layers.1.self_attn"),
    _decoder("qwen2-moe", _qwen2_moe, "model.layers.1.self_attn",
             fwd_module="model.layers.1.mlp.shared_expert.down_proj",
             bwd_module="model.layers.1.mlp.shared_expert.up_proj",
             nan_module="model.layers.1.mlp.shared_expert.act_fn",
             hook_module="model.layers.1.mlp.shared_expert.act_fn",
             mlp_module="model.layers.1.mlp.shared_expert"),
    ZooSpec("gpt2", _gpt2, lm_batch, hf_loss, fwd_module="transformer.h.1.mlp.c_proj",
            bwd_module="transformer.h.1.mlp.c_fc", softmax_module="transformer.h.1.attn",
            nan_module="transformer.h.1.mlp.act", nan_op="aten.*", hook_module="transformer.h.1.mlp.act",
            mlp_module="transformer.h.1.mlp", notes="GPT-2 uses Conv1D (addmm) and gelu_new (tanh formula)"),
    ZooSpec("bert", _bert, mlm_batch, hf_loss, fwd_module="bert.encoder.layer.1.output.dense",
            bwd_module="bert.encoder.layer.1.intermediate.dense",
            softmax_module="bert.encoder.layer.1.attention.self",
            nan_module="bert.encoder.layer.1.intermediate.intermediate_act_fn", nan_op="aten.gelu",
            hook_module="bert.encoder.layer.1.intermediate.intermediate_act_fn",
            mlp_module="bert.encoder.layer.1.intermediate", notes="masked LM, padding mask"),
    ZooSpec("t5", _t5, seq2seq_batch, hf_loss, fwd_module="encoder.block.1.layer.1.DenseReluDense.wo",
            bwd_module="encoder.block.1.layer.1.DenseReluDense.wi",
            softmax_module="encoder.block.1.layer.0.SelfAttention",
            nan_module="encoder.block.1.layer.1.DenseReluDense.act", nan_op="aten.relu",
            hook_module="encoder.block.1.layer.1.DenseReluDense.act",
            mlp_module="encoder.block.1.layer.1.DenseReluDense"),
    ZooSpec("vit", _vit, image_batch, hf_loss, fwd_module="vit.layers.1.mlp.fc2",
            bwd_module="vit.layers.1.mlp.fc1", softmax_module="vit.layers.1.attention",
            nan_module="vit.layers.1.mlp.activation_fn", nan_op="aten.gelu",
            hook_module="vit.layers.1.mlp.activation_fn", mlp_module="vit.layers.1.mlp"),
    ZooSpec("cnn", SmallCNN, image_batch, cnn_loss, fwd_module="head", bwd_module="head", softmax_module=None,
            nan_module="act2", nan_op="aten.relu", hook_module="act1", mlp_module="head",
            notes="plain torch: Conv2d, BatchNorm2d, ReLU, Dropout(0.1), Linear"),
    ZooSpec("lstm", lambda: RNNLM("lstm"), lm_batch, rnn_loss, fwd_module="proj", bwd_module="proj",
            softmax_module=None, nan_module="act", nan_op="aten.gelu", hook_module="act", mlp_module="proj",
            notes="plain torch: Embedding, 2-layer LSTM, Linear, GELU, Linear",
            unsupported={"fp16": "torch 2.13 CPU (oneDNN) has no float16 LSTM under autocast: 'could not create "
                                 "a primitive descriptor for the LSTM forward propagation primitive'"}),
    ZooSpec("gru", lambda: RNNLM("gru"), lm_batch, rnn_loss, fwd_module="proj", bwd_module="proj",
            softmax_module=None, nan_module="act", nan_op="aten.gelu", hook_module="act", mlp_module="proj",
            notes="plain torch: Embedding, 2-layer GRU, Linear, GELU, Linear"),
]}


#: models that need only torch (the rest need ``transformers``)
PLAIN = frozenset({"cnn", "lstm", "gru"})


# ---- training --------------------------------------------------------------------------------

class Trainer:
    """A model of the zoo in one precision, its AdamW optimizer and its batch.

    :meth:`step` runs one training step (seed reset first, so dropout masks repeat) and returns
    the loss as a Python float. Two ``Trainer`` objects of the same model and precision produce
    bitwise identical runs.
    """

    def __init__(self, spec: ZooSpec, precision: str = "fp32", seed: int = 0) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.spec, self.precision = spec, precision
        torch.manual_seed(seed)
        model = spec.build()
        self.batch = spec.batch()
        if precision == "bf16":
            model = model.to(torch.bfloat16)
            self.batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in self.batch.items()}
        model.train()
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if precision == "fp16" else None
        self.steps_done = 0

    def _autocast(self) -> Any:
        if self.precision == "fp16":
            return torch.autocast("cpu", dtype=torch.float16)
        return contextlib.nullcontext()

    def step(self) -> float:
        torch.manual_seed(1000 + self.steps_done)
        with self._autocast():
            loss = self.spec.loss(self.model, self.batch)
        backward_and_step(loss, self.opt, self.scaler)
        self.opt.zero_grad(set_to_none=True)
        self.steps_done += 1
        return float(loss.detach())

    def train(self, steps: int = 1) -> list[float]:
        return [self.step() for _ in range(steps)]


def module_names(model: nn.Module) -> set[str]:
    return {n for n, _ in model.named_modules()}
