"""New-user check of this session's changes on HF models: a scheduled api / aten dump (every=2,
light='module'), optimizer-in-backward with steps=[2], fp32 and bf16: losses bitwise equal to the
tool-off run, full steps hold api/aten records, light steps module records, stacks clean."""
import json, sys, tempfile, glob, torch, warnings
warnings.filterwarnings("ignore")
import torchparity
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
import transformers as T

def llama():
    c = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=128, max_position_embeddings=64)
    c._attn_implementation = "eager"; return T.LlamaForCausalLM(c)
def bert():
    c = T.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, max_position_embeddings=64)
    return T.BertForMaskedLM(c)
def cnn():
    c = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
    return T.ResNetForImageClassification(c)
MODELS = {"llama": llama, "bert": bert, "cnn": cnn}

def batch(name, dtype):
    g = torch.Generator().manual_seed(0)
    if name == "cnn":
        return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g).to(dtype), labels=torch.randint(0, 10, (2,), generator=g))
    ids = torch.randint(0, 128, (2, 16), generator=g)
    return dict(input_ids=ids, labels=ids)

def run(name, dtype, n=4, **dump):
    torch.manual_seed(0)
    m = MODELS[name]().to(dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    b = batch(name, dtype)
    losses = []
    ctx = torchparity.dump(dump.pop("path"), model=m, fsync=False, **dump) if dump else None
    if ctx: ctx.start()
    for _ in range(n):
        loss = m(**b).loss; loss.backward(); opt.step(); opt.zero_grad(); losses.append(loss.item())
    if ctx: ctx.stop()
    return losses

def levels(d, step):
    f = glob.glob(f"{d}/step{step}/rank0/records.jsonl")
    return sorted({json.loads(l)["level"] for l in open(f[0])}) if f else []

ok = True
for name in MODELS:
    for dtype in (torch.float32, torch.bfloat16):
        base = run(name, dtype)
        for level in ("api", "aten", "mix"):
            d = tempfile.mkdtemp()
            got = run(name, dtype, path=d, level=level, every=2, light="module")
            lv = [levels(d, s) for s in range(4)]
            full = {"api": ["api"], "aten": ["aten"], "mix": ["api", "module"]}[level]
            good = got == base and lv[0] == full and lv[2] == full and lv[1] == ["module"] and lv[3] == ["module"] \
                and not _get_current_function_mode_stack() and not _get_current_dispatch_mode_stack()
            ok &= good
            print(f"{name:6s} {str(dtype)[6:]:9s} {level:4s} every=2 light=module: {'OK' if good else 'FAIL'} losses equal {got == base}, levels per step {lv}")
print("ALL OK" if ok else "SOME FAILED")
