"""Op families and the advice for each: which kind of op a record is, and what to try for that kind.

:func:`op_base` reduces an op or record name to its bare op name (``aten.mm.default`` -> ``mm``);
:func:`family_of` maps that name to a :class:`Family` (matmul, conv, normalisation, softmax, ...)
whose ``advice`` the advisor prints under "What to try next". :data:`GENERIC_ADVICE` is for an op
of no known family. Pure rules: no I/O, nothing heavy imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchparity.plugin_types import DEFAULT_COLLECTIVE_OPS

_NAMESPACES = {"aten", "prims", "c10d", "_c10d_functional", "npu", "torch_npu", "musa", "custom"}
_PREFIXES = {"Aten", "Functional", "Torch", "Tensor", "Distributed", "NPU", "Module", "Mint"}
_BACKWARD_RE = re.compile(r"_backward(_[a-z]+)?$")


def op_base(op: str, name: str = "") -> tuple[str, bool]:
    """The bare op name and whether it is a backward kernel.

    ``aten.mm.default`` -> ``mm``; ``torch.nn.functional.linear`` -> ``linear``;
    ``Tensor.__mul__`` -> ``mul``; ``aten.native_layer_norm_backward.default`` ->
    (``native_layer_norm``, True); ``MLP`` -> ``mlp``.
    """
    s = op or name or ""
    parts = [p for p in s.split(".") if p]
    if not parts:
        return "", False
    if parts[0] in _NAMESPACES and len(parts) >= 2:
        base = parts[1]
    elif parts[0] in _PREFIXES and len(parts) >= 2:
        base = parts[1]
    elif parts[0] == "torch":
        base = parts[-1]
    else:
        tail = [p for p in parts if p not in ("default", "Tensor", "Scalar", "out", "forward", "backward") and not p.isdigit()]
        base = tail[-1] if tail else parts[0]
    base = base.strip("_").lower()
    backward = False
    m = _BACKWARD_RE.search(base)
    if m:
        backward = True
        base = base[: m.start()].strip("_")
    return base, backward


@dataclass(frozen=True)
class Family:
    key: str
    title: str
    pattern: re.Pattern[str]
    advice: tuple[str, ...]


def _fam(key: str, title: str, pattern: str, *advice: str) -> Family:
    return Family(key, title, re.compile(pattern), advice)


FAMILIES: tuple[Family, ...] = (
    _fam(
        "attention", "attention kernel",
        r"(scaled_dot_product|flash_attention|efficient_attention|fusion_attention|sdpa|attention)",
        "Fused attention kernels differ in how they accumulate QK^T and the softmax (online softmax, "
        "tiling, low-precision accumulators). Compare against the math implementation: "
        "`with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH): ...` on the device.",
        "Check the mask and scale: a boolean vs additive mask, -inf vs torch.finfo(dtype).min, and "
        "the default scale 1/sqrt(head_dim) must match on both sides.",
        "The matmul precision switches (TF32, reduced-precision reductions) apply inside attention too.",
    ),
    _fam(
        "matmul", "matrix multiplication",
        r"^(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|addmv|mv|dot|vdot|einsum|scaled_mm|tensordot|inner|"
        r"outer|addr|chain_matmul|multi_dot|fused_linear|npu_linear|grouped_mm|grouped_matmul)$",
        "The device may run this matmul in a reduced-precision mode the benchmark does not use: TF32 for "
        "float32 inputs, or float16/bfloat16 accumulation for half inputs. Turn them off on the device "
        "and compare again:\n"
        "    torch.backends.cuda.matmul.allow_tf32 = False            # and torch.set_float32_matmul_precision(\"highest\")\n"
        "    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False\n"
        "    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False\n"
        "On Ascend (torch_npu), HF32 is the analogue of TF32 and the ACL precision mode decides whether "
        "float32 matmuls may run in float16:\n"
        "    torch.npu.matmul.allow_hf32 = False\n"
        "    torch_npu.npu.set_option({\"ACL_PRECISION_MODE\": \"must_keep_origin_dtype\"})   # not allow_fp32_to_fp16\n"
        "On Moore Threads MUSA: torch.backends.mudnn.allow_tf32 = False. MetaX MACA follows the CUDA "
        "switches above. torchparity records these switches in each dump header (header.json, "
        "backend.numerics): compare them between the two dumps, or pin them in plugins.yaml "
        "(backends.options.<backend>).",
        "If the error disappears with those switches off, the kernel is fine and the difference is the "
        "precision mode: decide whether your training tolerates it.",
        "A long inner (reduction) dimension accumulates more rounding: compare the output error with "
        "the dtype's epsilon times sqrt(K) before calling it a bug.",
    ),
    _fam(
        "conv", "convolution",
        r"(conv|convolution)",
        "cuDNN-style libraries pick different algorithms (and TF32) per shape; pin them on the device:\n"
        "    torch.backends.cudnn.allow_tf32 = False\n"
        "    torch.backends.cudnn.benchmark = False\n"
        "    torch.backends.cudnn.deterministic = True\n"
        "On Ascend: torch.npu.conv.allow_hf32 = False (and ACL_PRECISION_MODE must_keep_origin_dtype, as "
        "for matmul); on MUSA: torch.backends.mudnn.allow_tf32 = False.",
        "Check padding mode, dilation, groups and the memory format (channels_last) on both sides.",
    ),
    _fam(
        "norm", "normalisation",
        r"(layer_norm|rms_norm|rmsnorm|group_norm|batch_norm|instance_norm|native_norm|local_response_norm)",
        "Compare the eps on both sides (1e-5 vs 1e-6 is a common mismatch between implementations and "
        "configs; RMSNorm implementations differ most). A different eps shows exactly like this: inputs "
        "equal, output off, worst for rows with a small variance.",
        "Mean and variance should be accumulated in float32 even for float16/bfloat16 inputs. If the "
        "device kernel accumulates in low precision, compute the norm in float32: "
        "`F.layer_norm(x.float(), shape, w.float(), b.float(), eps).to(x.dtype)`.",
        "For batch_norm: train vs eval mode, running statistics and momentum must match.",
    ),
    _fam(
        "softmax", "softmax / loss",
        r"(softmax|cross_entropy|nll_loss|logsumexp|log_softmax|kl_div|binary_cross_entropy)",
        "Compute softmax-like ops in float32: `torch.softmax(x, dim=-1, dtype=torch.float32)` (or "
        "`x.float().log_softmax(-1)`), then cast back. In float16/bfloat16 the exponent sum loses precision "
        "and large logits overflow.",
        "Check the masking value: -inf, -1e4 and torch.finfo(dtype).min behave differently in low "
        "precision (a fully masked row gives NaN with -inf).",
        "For losses: label_smoothing, ignore_index, reduction and class weights must match.",
    ),
    _fam(
        "overflow", "exp / pow / div",
        r"^(exp|exp2|expm1|pow|float_power|div|true_divide|reciprocal|rsqrt|sqrt|log|log2|log10|log1p|square|xlogy)$",
        "float16 overflows above 65504: exp(x) is inf for x > 11.09, pow and division by small numbers "
        "overflow easily. Compute this op in float32 or bfloat16, clamp its input, or add an eps to "
        "divisors.",
        "Check for NaN/Inf on the device with `torchparity.NanInfTracker` to find the first op that "
        "produced one.",
    ),
    _fam(
        "activation", "activation",
        r"^(gelu|silu|swiglu|swish|mish|sigmoid|tanh|erf|erfc|hardswish|hardsigmoid|elu|selu|celu|softplus|glu)$",
        "Activations are often approximated in fused kernels: check gelu's `approximate` ('none' vs "
        "'tanh') and whether the device uses a fast sigmoid/exp. The scalar arguments of the call show "
        "in the compare rows (Err_message) when they differ.",
    ),
    _fam(
        "random", "random op",
        r"(dropout|bernoulli|^rand|randn|randint|randperm|multinomial|^normal$|^uniform$|exponential|poisson|rrelu)",
        "Random ops only match if both sides draw the same numbers, and devices of different vendors use "
        "different generators even with the same seed. Disable randomness for the comparison "
        "(`model.eval()`, dropout p=0) or seed both sides (`torch.manual_seed`, the device's "
        "`manual_seed_all`) and compare with the same backend.",
    ),
    _fam(
        "nondeterministic", "reduction / scatter",
        r"^(sum|nansum|mean|cumsum|cumprod|prod|scatter|scatter_add|scatter_reduce|index_add|index_put|"
        r"index_copy|put|embedding_dense|embedding|histc|bincount|segment_reduce|var|std|var_mean|norm|"
        r"linalg_vector_norm|upsample_\w+|grid_sampler_\w+|ctc_loss)$",
        "Parallel reductions, scatters and index_add use atomics or a shape-dependent order on the device, "
        "so their result can change from run to run by a few ulps. Run the device twice and compare it "
        "with itself: if it differs, this is non-determinism, not a wrong kernel.",
        "Force deterministic kernels on the device: `torch.use_deterministic_algorithms(True)` (on CUDA "
        "also `CUBLAS_WORKSPACE_CONFIG=:4096:8`).",
    ),
    _fam(
        "collective", "collective communication",
        "^(" + "|".join(sorted(re.escape(c.strip("_")) for c in DEFAULT_COLLECTIVE_OPS)) + ")$",
        "Collectives sum in an order that depends on the algorithm and topology (ring vs tree, number "
        "of ranks), so results differ in the last bits. Compare each rank's input to the collective "
        "first: if the inputs match and the output does not, pin the algorithm (e.g. NCCL_ALGO=Ring, "
        "HCCL_DETERMINISTIC=true on Ascend) and compare again.",
        "A collective cannot be re-executed by replay; compare the per-rank dumps of its inputs.",
    ),
    _fam(
        "cast", "cast / copy",
        r"^(to|to_copy|copy|type_as|clone|contiguous|view_as_real|npu_format_cast)$",
        "Casts to float16/bfloat16 round; devices may differ in the rounding mode (round-to-nearest-even "
        "vs truncation) or in subnormal handling (flush-to-zero). Check the dtypes on both sides.",
    ),
    _fam(
        "optimizer", "optimizer update",
        r"^(adam|adamw|sgd|fused_adam|fused_adamw|foreach_\w+|lerp|addcdiv|addcmul)$",
        "Optimizer updates amplify tiny gradient differences (Adam divides by sqrt(v)+eps). Compare the "
        "gradients first; check eps, weight decay, the fused/foreach implementation and whether master "
        "weights are kept in float32.",
    ),
)

GENERIC_ADVICE = (
    "Re-run the op alone on both devices with the same inputs (see 'Reproduce' below) to confirm the "
    "kernel differs; then check its arguments (dtype, scalar arguments, memory format).",
)


def family_of(op: str, name: str = "", phase: str = "") -> Family | None:
    """The :class:`Family` an op belongs to (by its bare name), or None."""
    base, _ = op_base(op, name)
    if phase == "optimizer":
        fam = next((f for f in FAMILIES if f.key == "optimizer"), None)
        if fam and fam.pattern.search(base):
            return fam
    for fam in FAMILIES:
        if fam.pattern.search(base):
            return fam
    return None
