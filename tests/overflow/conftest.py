"""Fixtures for the overflow checker: synthetic dump frames (docs/dump-format.md columns) and a
tiny aten-level recorder that turns a real model run into such a frame without the dump engine."""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd
import pytest

COLUMNS = [
    "record_id", "name", "op", "level", "phase", "module", "module_class", "call_index", "step", "rank",
    "fwd", "stack", "flags", "io", "arg", "kind", "dtype", "shape", "stride", "device", "requires_grad",
    "max", "min", "mean", "norm", "nan", "inf", "md5", "value", "file", "key", "producer",
]


def entry(record_id: int, op: str, io: str, *, arg: str = "0", dtype: str = "float32", mx: float = 1.0,
          mn: float = -1.0, mean: float = 0.0, norm: float = 1.0, nan: int = 0, inf: int = 0,
          phase: str = "forward", module: str = "", step: int = 0, rank: int = 0, name: str | None = None,
          stack: Any = None, kind: str = "tensor") -> dict[str, Any]:
    """One tensor row as load_dump returns it."""
    row = dict.fromkeys(COLUMNS)
    row.update(record_id=record_id, name=name or f"Aten.{op.split('.')[1] if op.startswith('aten.') else op}.{record_id}.{phase}",
               op=op, level="aten", phase=phase, module=module, call_index=0, step=step, rank=rank, stack=stack,
               flags={}, io=io, arg=arg, kind=kind, dtype=dtype, shape=(4,), max=mx, min=mn, mean=mean, norm=norm,
               nan=nan, inf=inf)
    return row


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def _stats(t: Any) -> dict[str, Any]:
    import torch

    if t.numel() == 0:
        return dict(max=None, min=None, mean=None, norm=None, nan=0, inf=0)
    if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
        x = t.to(torch.float32)
        return dict(max=float(x.max()), min=float(x.min()), mean=None, norm=None, nan=0, inf=0)
    x = t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32)
    return dict(max=float(x.max()), min=float(x.min()), mean=float(x.mean()), norm=float(x.norm()),
                nan=int(torch.isnan(x).sum()), inf=int(torch.isinf(x).sum()))


def record_model(run: Callable[[], Any], model: Any, step: int = 0) -> pd.DataFrame:
    """Run ``run()`` under a TorchDispatchMode and return a load_dump-shaped frame (aten level,
    statistics mode): one row per tensor input/output of every aten op, with module paths."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    module_stack: list[str] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = []

    def push(mod: Any, args: Any) -> None:
        module_stack.append(names[mod])

    def pop(mod: Any, args: Any, out: Any) -> None:
        module_stack.pop()

    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(push))
        hooks.append(m.register_forward_hook(pop))
    rows: list[dict[str, Any]] = []

    class Rec(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat_in, _ = tree_flatten((args, kwargs))
            ins = [(i, a, _stats(a)) for i, a in enumerate(flat_in) if isinstance(a, torch.Tensor)]
            out = func(*args, **kwargs)
            flat_out, _ = tree_flatten(out)
            rid = len({r["record_id"] for r in rows})
            phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
            module = module_stack[-1] if module_stack else ""
            op = f"{func.namespace}.{func._schema.name.split('::')[-1]}.{func._overloadname}"
            for io, items in (("input", ins), ("output", [(i, o, _stats(o)) for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor)])):
                for i, t, st in items:
                    r = entry(rid, op, io, arg=str(i), dtype=str(t.dtype).replace("torch.", ""), phase=phase,
                              module=module, step=step, stack=None)
                    r.update(st)
                    r["name"] = f"Aten.{op.split('.')[1]}.{rid}.{phase}"
                    rows.append(r)
            return out

    try:
        with Rec():
            run()
    finally:
        for h in hooks:
            h.remove()
    return frame(rows)


class TinyTransformer:
    """Factory for a 2-layer pre-norm transformer; ``plant`` makes one layer's MLP overflow."""

    @staticmethod
    def build(plant_layer: int | None = None) -> Any:
        import torch
        from torch import nn

        class MLP(nn.Module):
            def __init__(self, d: int, plant: bool) -> None:
                super().__init__()
                self.fc1, self.fc2, self.plant = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), plant

            def forward(self, x):
                h = torch.relu(self.fc1(x))
                if self.plant:
                    h = h * 1e39  # float32 overflow: finite inputs, Inf/NaN output
                return self.fc2(h)

        class Block(nn.Module):
            def __init__(self, d: int, plant: bool) -> None:
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
                self.mlp = MLP(d, plant)

            def forward(self, x):
                h = self.ln1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.emb = nn.Embedding(32, 16)
                self.layers = nn.ModuleList([Block(16, plant_layer == i) for i in range(2)])
                self.head = nn.Linear(16, 32)

            def forward(self, ids):
                x = self.emb(ids)
                for layer in self.layers:
                    x = layer(x)
                logits = self.head(x)
                # a common guard: non-finite logits replaced before the loss (absorbs the overflow)
                return torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))

        return Model()


@pytest.fixture
def tiny_transformer() -> type[TinyTransformer]:
    return TinyTransformer


@pytest.fixture
def recorder() -> Callable[..., pd.DataFrame]:
    return record_model


@pytest.fixture
def make_entry() -> Callable[..., dict[str, Any]]:
    return entry


@pytest.fixture
def make_frame() -> Callable[[list[dict[str, Any]]], pd.DataFrame]:
    return frame


def isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)
