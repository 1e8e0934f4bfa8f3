"""Small built-in models for the demo, the tests and the benchmarks (no downloads).

``TinyLlama`` is a Llama-shaped decoder (token embedding, RMSNorm, causal self-attention with
q/k/v/o projections, SiLU-gated MLP, LM head) small enough to train a few steps on a CPU in
seconds. :func:`train` runs forward + backward + AdamW and returns the losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyConfig:
    vocab: int = 128
    dim: int = 64
    layers: int = 2
    heads: int = 4
    hidden: int = 128
    seq: int = 16
    batch: int = 4
    eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q = self.q_proj(x).view(b, t, h, d // h).transpose(1, 2)
        k = self.k_proj(x).view(b, t, h, d // h).transpose(1, 2)
        v = self.v_proj(x).view(b, t, h, d // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or TinyConfig()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def make_model(seed: int = 0, cfg: TinyConfig | None = None, dtype: torch.dtype = torch.float32) -> TinyLlama:
    torch.manual_seed(seed)
    return TinyLlama(cfg).to(dtype)


def make_batches(n: int, seed: int = 1, cfg: TinyConfig | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = cfg or TinyConfig()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], lr: float = 1e-3) -> list[float]:
    """Forward + cross-entropy + backward + AdamW for each batch; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
