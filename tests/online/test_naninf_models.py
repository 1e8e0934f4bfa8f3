"""NanInfTracker on tiny random-init Hugging Face models (issue 14): no finding on clean models
(the eager Llama's ``finfo.min`` mask, T5's ``log(0)`` in the relative-position bucket), the
planted NaN named at the op (or the write) that created it, and never a NaN loss without one."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchparity.online.naninf import NanInfTracker

transformers = pytest.importorskip("transformers")
NAN = float("nan")


def _llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _t5(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(cfg).to(dtype)


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                 bos_token_id=1, eos_token_id=1)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def _batch(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (2, 8), generator=g)
    if isinstance(model, transformers.T5ForConditionalGeneration):
        return {"input_ids": ids, "labels": torch.randint(1, 64, (2, 5), generator=g)}
    batch = {"input_ids": ids, "labels": ids}
    if isinstance(model, transformers.BertForMaskedLM):
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 5:] = 0  # padding
        batch["attention_mask"] = mask
    return batch


def _step(model: torch.nn.Module, batch: dict[str, Any], steps: int = 1) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _tracked(make: Callable[[], torch.nn.Module], **kw: Any) -> tuple[NanInfTracker, list[float]]:
    model = make(**kw)
    with NanInfTracker(model) as t:
        losses = _step(model, _batch(model))
    return t, losses


@pytest.mark.parametrize("make", [_llama, _t5], ids=["llama-eager", "t5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_clean_model_no_finding_and_bitwise_identical(make: Callable, dtype: torch.dtype) -> None:
    ref = make(dtype)
    ref_losses = _step(ref, _batch(ref))
    t, losses = _tracked(make, dtype=dtype)
    assert t.findings == [], [str(f) for f in t.findings]
    assert losses == ref_losses  # the tool never changes the numerics


def test_t5_log_of_zero_is_absorbed_information() -> None:
    t, _ = _tracked(_t5)
    assert any(f.op.startswith("aten.log") for f in t.absorbed), [str(f) for f in t.absorbed]


class _PlantNaN(TorchDispatchMode):
    """An emulated faulty device: the ``call``-th forward ``op`` returns a NaN at index 3."""

    def __init__(self, op: Any, call: int) -> None:
        super().__init__()
        self.op, self.call, self.seen = op, call, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is self.op and torch._C._current_graph_task_id() == -1:
            if self.seen == self.call:
                out = out.clone()
                out.view(-1)[3] = NAN
            self.seen += 1
        return out


def test_llama_planted_nan_in_silu_named_at_silu() -> None:
    model = _llama()
    with _PlantNaN(torch.ops.aten.silu.default, call=1):  # layer 1's act_fn (outside the tracker)
        with NanInfTracker(model) as t:
            losses = _step(model, _batch(model))
    assert losses[0] != losses[0]
    f = t.findings[0]
    assert (f.kind, f.op, f.module, f.phase) == ("created", "aten.silu.default", "model.layers.1.mlp.act_fn", "forward")


def test_t5_planted_nan_not_hidden_by_log_of_zero() -> None:
    model = _t5()
    with _PlantNaN(torch.ops.aten.relu.default, call=2):  # a decoder layer's FF activation
        with NanInfTracker(model) as t:
            _step(model, _batch(model))
    assert [(f.kind, f.op) for f in t.findings][:1] == [("created", "aten.relu.default")]
    assert not any(f.op.startswith("aten.log") for f in t.findings)


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Dropout(0.1), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))


def _cnn_step(model: torch.nn.Module) -> list[float]:
    torch.manual_seed(2)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return [loss.item()]


def _write_nan(module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
    out[..., 3] = NAN  # an in-place write in a forward hook


@pytest.mark.parametrize("case", ["gpt2", "bert", "cnn"])
def test_nan_written_by_forward_hook_named_at_the_write(case: str) -> None:
    if case == "cnn":
        model = _cnn()
        hooked = "1"  # BatchNorm (ReLU saves its output for backward: writing it breaks autograd)
        run = _cnn_step
    else:
        model = _gpt2() if case == "gpt2" else _bert()
        hooked = "transformer.h.0.mlp.act" if case == "gpt2" else "bert.encoder.layer.0.intermediate.intermediate_act_fn"
        run = lambda m: _step(m, _batch(m))  # noqa: E731
    model.get_submodule(hooked).register_forward_hook(_write_nan)
    with NanInfTracker(model) as t:
        losses = run(model)
    assert losses[0] != losses[0]
    f = t.findings[0]
    assert f.kind == "created" and f.phase == "forward" and f.value == "NaN", str(f)
    assert f.op.split(".")[1] in ("fill_", "copy_", "index_put_", "_index_put_impl_"), str(f)
    # the hook runs after the module's exit: capture attributes it to the parent for now (issue 14,
    # capture slice); the write is inside the hooked module's parent either way
    parent = hooked.rpartition(".")[0]
    assert f.module in (hooked, parent), str(f)


def test_hook_returning_output_times_nan_is_a_finding() -> None:
    model = _gpt2()
    model.transformer.h[1].mlp.register_forward_hook(lambda m, a, out: out * NAN)
    with NanInfTracker(model) as t:
        losses = _step(model, _batch(model))
    assert losses[0] != losses[0]
    assert t.findings and t.findings[0].kind == "created" and t.findings[0].op == "aten.mul.Tensor", \
        [str(f) for f in t.findings]


@pytest.mark.parametrize("plant", ["scalar", "hook", "silu"])
def test_nan_loss_never_without_a_finding(plant: str) -> None:
    model = _llama()
    if plant == "scalar":
        model.model.layers[0].register_forward_hook(lambda m, a, out: out * NAN if isinstance(out, torch.Tensor)
                                                    else (out[0] * NAN, *out[1:]))
    elif plant == "hook":
        model.model.layers[1].mlp.act_fn.register_forward_hook(_write_nan)
    ctx = _PlantNaN(torch.ops.aten.silu.default, call=0) if plant == "silu" else NullMode()
    with ctx:
        with NanInfTracker(model) as t:
            losses = _step(model, _batch(model), steps=2)
    assert all(x != x for x in losses)
    assert t.findings and t.findings[0].step == 0, [str(f) for f in t.findings]


class NullMode:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def test_t5_clean_on_the_device_fold_path() -> None:
    """The device path (screens folded on the device, run on the CPU here) walks the lineage of
    its sites too: T5's log(0) is absorbed there as well."""
    model = _t5()
    t = NanInfTracker(model)
    t._host_read = False
    with t:
        _step(model, _batch(model))
    assert t.findings == [], [str(f) for f in t.findings]
    assert any(f.op.startswith("aten.log") for f in t.absorbed)
