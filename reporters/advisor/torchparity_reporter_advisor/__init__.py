"""torchparity advisor: writes ``OUT/advisor.txt``, a diagnosis in plain words.

It says where the run diverged (step, rank, op, module, phase), why that op is the suspect (its
input error against its output error, the amplification, its metrics), which other ops are
suspects, what to try next for that kind of op (matmul/conv precision modes, normalisation eps,
softmax in low precision, fp16 overflow, randomness, non-deterministic kernels, collectives) and
how to reproduce the op alone (``torchparity replay``).

It never says "all OK" when a row is an error: when there are errors but no root cause it lists
them (msprobe 8.3.3's advisor printed "All data ... meets the accuracy requirements" next to 66
red cells).

:func:`advise` returns the text; the reporter writes it. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from torchparity import hookimpl
from torchparity.plugin_types import prepare_output_dir
from torchparity.results import complete_first_divergence
from torchparity.errors import PluginError
from torchparity.plugin_types import DEFAULT_COLLECTIVE_OPS, Reporter

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import CompareResult, Suspect

__version__ = "0.1.0"

#: machine epsilon by dtype name: an error of a few eps is rounding, not a bug
DTYPE_EPS = {
    "float64": 2.22e-16, "float32": 1.19e-07, "tfloat32": 9.77e-04, "float16": 9.77e-04,
    "bfloat16": 7.81e-03, "float8_e4m3fn": 0.125, "float8_e5m2": 0.25,
}

# ------------------------------------------------------------------------------------------
# op families and their advice
# ------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------
# formatting helpers
# ------------------------------------------------------------------------------------------


def fmt(x: Any, spec: str = ".3g") -> str:
    """A number for people: 3 significant digits, NaN/inf spelled out, None as 'n/a'."""
    if x is None:
        return "n/a"
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(xf):
        return "NaN"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    return format(xf, spec)


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _get(row: Mapping[str, Any], key: str) -> Any:
    v = row.get(key)
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _where(step: Any, rank: Any, phase: Any) -> str:
    bits = []
    if step is not None:
        bits.append(f"step {step}")
    if rank is not None:
        bits.append(f"rank {rank}")
    if phase:
        bits.append(str(phase))
    return ", ".join(bits)


# ------------------------------------------------------------------------------------------
# the text
# ------------------------------------------------------------------------------------------


class _Doc:
    def __init__(self, width: int) -> None:
        self.width = max(40, width)
        self.lines: list[str] = []

    def h(self, title: str) -> None:
        if self.lines:
            self.lines.append("")
        self.lines += [title, "-" * len(title)]

    def p(self, text: str, indent: str = "") -> None:
        for para in text.split("\n"):
            if para.startswith("    "):  # code: never wrapped
                self.lines.append(indent + para)
            else:
                self.lines += textwrap.wrap(para, self.width, initial_indent=indent, subsequent_indent=indent,
                                            break_on_hyphens=False, break_long_words=False) or [""]

    def bullet(self, text: str, mark: str = "- ") -> None:
        pad = " " * len(mark)
        first = True
        for para in text.split("\n"):
            if para.startswith("    "):
                self.lines.append(pad + para)
                continue
            wrapped = textwrap.wrap(para, self.width, initial_indent=mark if first else pad, subsequent_indent=pad,
                                    break_on_hyphens=False, break_long_words=False)
            self.lines += wrapped or [""]
            first = False

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def _rows_records(rows: pd.DataFrame | None, mask: Any) -> list[dict[str, Any]]:
    if rows is None or len(rows) == 0:
        return []
    return rows[mask].to_dict("records")


def _root_rows(rows: pd.DataFrame | None, rc: Suspect) -> list[dict[str, Any]]:
    if rows is None or len(rows) == 0 or "device_name" not in rows.columns:
        return []
    m = rows["device_name"].astype(object).eq(rc.name)
    for col, val in (("step", rc.step), ("rank", rc.rank)):
        if col in rows.columns:
            m &= rows[col].eq(val) | rows[col].isna()
    return _rows_records(rows, m.fillna(False).astype(bool))


def _tensor_line(r: Mapping[str, Any]) -> str:
    """One tensor of an op with the metrics it has."""
    parts = [str(_get(r, "tensor") or _get(r, "io") or "?")]
    dtype = _get(r, "device_dtype")
    bdtype = _get(r, "bench_dtype")
    shape = _get(r, "device_shape")
    if dtype:
        parts.append(f"{dtype}" + (f" (bench {bdtype})" if bdtype and bdtype != dtype else ""))
    if shape is not None:
        parts.append("shape " + (str(list(shape)) if not isinstance(shape, str) else shape))
    for key, label, spec in (("rel_l2", "rel err", ".3g"), ("cosine", "cosine", ".6f"), ("max_abs_err", "max abs err", ".3g"),
                             ("max_rel_err", "max rel err", ".3g"), ("one_thousandth_ratio", "1/1000 ratio", ".3g"),
                             ("norm_rel_diff", "norm rel diff", ".3g")):
        v = _get(r, key)
        if v is not None:
            parts.append(f"{label} {fmt(v, spec)}")
    nan = _int(_get(r, "device_nan")) + _int(_get(r, "device_inf"))
    bnan = _int(_get(r, "bench_nan")) + _int(_get(r, "bench_inf"))
    if nan or bnan:
        parts.append(f"NaN/Inf: device {nan}, bench {bnan}")
    verdict = _get(r, "verdict")
    if verdict:
        parts.append(f"-> {verdict}")
    return ", ".join(parts)


def _row_label(r: Mapping[str, Any]) -> str:
    name = _get(r, "device_name") or _get(r, "bench_name") or "?"
    tensor = _get(r, "tensor")
    label = f"{name}.{tensor}" if tensor else str(name)
    where = _where(_get(r, "step"), _get(r, "rank"), None)
    mod = _get(r, "module")
    extra = ", ".join(x for x in (f"module {mod}" if mod else "", where) if x)
    return f"{label} ({extra})" if extra else label


def _count(summary: Mapping[str, Any], rows: pd.DataFrame | None, key: str, verdict: str) -> int:
    """A verdict count from the summary (``n_unmatched`` may be split into device/bench) or the rows."""
    if key in summary and summary[key] is not None:
        return _int(summary[key])
    if verdict == "unmatched" and ("n_unmatched_device" in summary or "n_unmatched_bench" in summary):
        return _int(summary.get("n_unmatched_device")) + _int(summary.get("n_unmatched_bench"))
    if rows is None or len(rows) == 0:
        return 0
    if verdict == "unmatched":
        return int(rows["match"].astype(object).eq("unmatched").sum()) if "match" in rows.columns else 0
    return int(rows["verdict"].astype(object).eq(verdict).sum()) if "verdict" in rows.columns else 0


first_divergence = complete_first_divergence  # shared with the other reporters (torchparity.results)


def _replay_case(summary: Mapping[str, Any], rc: Suspect | None) -> str | None:
    """A replay case path the compare recorded for the root cause, if any."""
    for key in ("replay_case", "replay_cases", "cases"):
        v = summary.get(key)
        if not v:
            continue
        if isinstance(v, (str, os.PathLike)):
            return os.fspath(v)
        if isinstance(v, Mapping):
            if rc is not None and rc.name in v:
                return os.fspath(v[rc.name])
            first = next(iter(v.values()), None)
            return os.fspath(first) if first else None
        if isinstance(v, Sequence) and len(v):
            return os.fspath(v[0])
    return None


def advise(result: CompareResult, *, top_suspects: int = 5, max_errors: int = 10, width: int = 100) -> str:
    """The advisor's text for ``result``."""
    rows = result.rows
    summary: Mapping[str, Any] = dict(result.summary or {})
    rc = result.root_cause
    d = _Doc(width)

    n_rows = _int(summary.get("n_rows"), len(rows) if rows is not None else 0)
    n_err = _count(summary, rows, "n_error", "error")
    n_warn = _count(summary, rows, "n_warning", "warning")
    n_pass = _count(summary, rows, "n_pass", "pass")
    n_unm = _count(summary, rows, "n_unmatched", "unmatched")
    n_skip = _count(summary, rows, "n_skip", "skip")

    title = "torchparity advisor"
    dev, bench = summary.get("device_dump") or summary.get("device_backend"), summary.get("bench_dump") or summary.get("bench_backend")
    if dev and bench:
        title += f": {dev} vs {bench}"
    d.lines += [title, "=" * len(title)]
    counts = f"{n_rows} rows: {n_err} error, {n_warn} warning, {n_pass} pass, {n_unm} unmatched"
    if n_skip:
        counts += f", {n_skip} skipped"
    if summary.get("mode"):
        counts += f" ({summary['mode']} mode)"

    # ---- verdict ----------------------------------------------------------------------------
    if rc is not None:
        d.p(f"DIVERGED. {counts}.")
        d.p(f"Root cause: {rc.name} ({rc.op}) in module '{rc.module or '<top level>'}', "
            f"{_where(rc.step, rc.rank, rc.phase)}.")
    elif n_err:
        d.p(f"NOT OK: {n_err} row{'s are' if n_err != 1 else ' is an'} error{'s' if n_err != 1 else ''}, "
            f"but no single op could be named as the root cause. {counts}.")
    elif n_warn:
        d.p(f"No errors, but {n_warn} warning{'s' if n_warn != 1 else ''}; no root cause was named. {counts}.")
    elif n_rows == 0 or (n_pass == 0 and n_rows > 0):
        d.p(f"NOTHING COMPARED: no tensor pair was judged ({counts}). This is not a clean result: check "
            "that both dumps cover the same steps, ranks and ops (level, mode).")
    elif not summary.get("complete", True):
        d.p(f"INCOMPLETE: no divergence among the tensors that were compared, but "
            f"{int(summary.get('n_not_compared') or 0)} paired tensor(s) could not be compared and "
            f"{int(summary.get('n_damaged') or 0)} damaged part(s) of the dumps were skipped. The runs are "
            f"not known to agree: see the warnings, and re-dump the damaged side. {counts}.")
    else:
        if n_unm:
            d.p(f"No divergence among the compared tensors: all {n_pass} judged rows agree within tolerance. "
                f"{n_unm} rows had no counterpart in the other dump and were not compared (see below).")
        else:
            d.p(f"No divergence: all {n_pass} compared tensors agree within tolerance. {counts}.")

    # ---- where ------------------------------------------------------------------------------
    fd = first_divergence(summary, rows, rc)
    if rc is not None or fd:
        d.h("Where it diverged")
        if isinstance(fd, Mapping) and fd:
            name = fd.get("name") or fd.get("op") or "?"
            bits = [f"First divergent row: {name}"]
            if fd.get("op") and fd.get("op") != name:
                bits.append(f"({fd['op']})")
            if fd.get("module"):
                bits.append(f"in module '{fd['module']}'")
            where = _where(fd.get("step"), fd.get("rank"), fd.get("phase"))
            d.p(" ".join(bits) + (f", {where}" if where else "") + ".")
        elif fd:
            d.p(f"First divergent row: {fd}.")
        if rc is not None:
            kind = {"parameter": "parameter", "input": "model input"}.get(rc.kind, "op")
            d.p(f"Root cause ({kind}): {rc.name}, op {rc.op}, module '{rc.module or '<top level>'}', "
                f"{_where(rc.step, rc.rank, rc.phase)}, execution index {rc.index}"
                + (f", benchmark record {rc.bench_name}" if rc.bench_name and rc.bench_name != rc.name else "") + ".")
            if isinstance(fd, Mapping) and fd.get("name") and fd.get("name") != rc.name:
                d.p(f"The first divergent row is not the root cause: {fd.get('name')} crossed a threshold "
                    f"first, but {rc.name} is where the error is introduced (largest amplification).")
            if rc.stack:
                d.p("Called from:")
                for fr in list(rc.stack)[-4:]:
                    d.p(f"    {fr}")

    # ---- why --------------------------------------------------------------------------------
    root_rows: list[dict[str, Any]] = []
    if rc is not None:
        d.h("Why this op is the suspect")
        root_rows = _root_rows(rows, rc)
        amp = rc.score
        if rc.kind == "parameter":
            d.p(f"The parameter itself differs before any op used it (error {fmt(rc.output_error)}).")
        elif rc.kind == "input":
            d.p(f"A model input already differs (error {fmt(rc.output_error)}): the divergence starts before the model.")
        elif amp is not None and math.isfinite(float(amp)) and float(amp) >= 10:
            d.p(f"Its inputs match the benchmark (largest input error {fmt(rc.input_error)}) but its output "
                f"is off by {fmt(rc.output_error)}: the op itself amplified the error x{fmt(amp)}.")
        else:
            d.p(f"Its output error ({fmt(rc.output_error)}) is x{fmt(amp)} its input error "
                f"({fmt(rc.input_error)}). The amplification is small: the error may already be building "
                "up upstream, and this op is where it first became large. Look at the suspects below too.")
        if rc.reason:
            d.p(f"Root-cause analysis: {rc.reason}.".replace("..", "."))
        outs = [r for r in root_rows if _get(r, "io") in ("output", None) and str(_get(r, "tensor") or "").startswith(("output", ""))]
        outs = [r for r in root_rows if _get(r, "io") == "output"] or outs
        if root_rows:
            d.p("Its tensors:")
            for r in root_rows:
                d.p("    " + _tensor_line(r))
            reasons = sorted({str(_get(r, "reason")) for r in root_rows if _get(r, "reason")})
            for reason in reasons[:3]:
                checker = next((_get(r, "checker") for r in root_rows if _get(r, "reason") == reason), None)
                d.p(f"Checker{f' {checker}' if checker else ''}: {reason}")
        out_dtype = next((_get(r, "device_dtype") for r in outs if _get(r, "device_dtype")), None)
        if out_dtype in DTYPE_EPS and rc.output_error is not None and math.isfinite(float(rc.output_error)):
            eps = DTYPE_EPS[out_dtype]
            ratio = float(rc.output_error) / eps
            judgement = ("below one rounding of that dtype" if ratio < 1
                         else "a few roundings of that dtype: a different accumulation order or precision mode can explain it"
                         if ratio < 8 else "far beyond rounding: the kernel computes something different")
            d.p(f"For scale: the output is {out_dtype}, whose machine epsilon is {fmt(eps)}; the output error "
                f"is {fmt(ratio)} eps, {judgement}.")
        mism = [r for r in root_rows if _get(r, "device_dtype") and _get(r, "bench_dtype") and _get(r, "device_dtype") != _get(r, "bench_dtype")]
        if mism:
            r = mism[0]
            d.p(f"Note: the two sides ran in different dtypes ({r['device_dtype']} vs {r['bench_dtype']}); some "
                "error is expected from that alone.")
        # errors that are not downstream of the root cause
        if rows is not None and len(rows) and {"verdict", "order"} <= set(rows.columns):
            same = rows["verdict"].astype(object).eq("error")
            if "step" in rows.columns:
                same &= rows["step"].eq(rc.step)
            if "rank" in rows.columns:
                same &= rows["rank"].eq(rc.rank)
            before = rows[same.fillna(False).astype(bool) & (rows["order"] < rc.index)]
            if len(before):
                d.p(f"Warning: {len(before)} error row(s) come before the root cause in execution order "
                    f"(first: {_row_label(before.iloc[0].to_dict())}); they are not explained by it, look at them too.")

    # ---- suspects ---------------------------------------------------------------------------
    others = [s for s in (result.suspects or []) if rc is None or s.name != rc.name or s.step != rc.step or s.rank != rc.rank]
    if others:
        d.h("Other suspects")
        for i, s in enumerate(others[: max(0, top_suspects)], 1):
            d.bullet(f"{s.name} ({s.op}) in '{s.module or '<top level>'}', {_where(s.step, s.rank, s.phase)}: "
                     f"input error {fmt(s.input_error)} -> output error {fmt(s.output_error)} (x{fmt(s.score)})."
                     + (f" {s.reason}" if s.reason else ""), mark=f"{i}. ")
        if len(others) > top_suspects:
            d.p(f"... and {len(others) - top_suspects} more (compare.json lists all of them).")

    # ---- errors without a root cause / warnings ------------------------------------------
    if rc is None and rows is not None and len(rows) and "verdict" in rows.columns and (n_err or n_warn):
        which = "error" if n_err else "warning"
        bad = rows[rows["verdict"].astype(object).eq(which)]
        if {"step", "rank", "order"} <= set(rows.columns):
            bad = bad.sort_values(["step", "rank", "order"], kind="stable")
        d.h(f"The {which}s" if len(bad) <= max_errors else f"The first {max_errors} of {len(bad)} {which}s")
        for r in bad.head(max_errors).to_dict("records"):
            reason = _get(r, "reason") or "no reason given"
            d.bullet(f"{_row_label(r)}: {reason}")
            d.p("    " + _tensor_line(r))
        if "reason" in bad.columns and len(bad) > 1:
            top = bad["reason"].astype(object).fillna("(none)").value_counts().head(3)
            d.p("Most common reasons: " + "; ".join(f"{k} ({v} rows)" for k, v in top.items()))

    # ---- unmatched -------------------------------------------------------------------------
    if n_unm and rows is not None and len(rows) and "match" in rows.columns:
        um = rows[rows["match"].astype(object).eq("unmatched")]
        names = list(dict.fromkeys(str(x) for x in um.get("device_name", um.get("bench_name")).dropna()))
        if names:
            d.h("Unmatched records")
            d.p(f"{n_unm} row{'s' if n_unm != 1 else ''} ({len(names)} record{'s' if len(names) != 1 else ''}) exist on one side only and were not compared: "
                + ", ".join(names[:5]) + (" ..." if len(names) > 5 else "") + ". An extra or missing op "
                "(e.g. a cast or a scaling the other side does not do) is itself a difference worth checking.")

    # ---- what to try -----------------------------------------------------------------------
    subject: dict[str, Any] | None = None
    if rc is not None:
        subject = {"op": rc.op, "name": rc.name, "phase": rc.phase, "level": rc.level, "kind": rc.kind, "module": rc.module}
    elif rows is not None and len(rows) and "verdict" in rows.columns and (n_err or n_warn):
        bad = rows[rows["verdict"].astype(object).isin(["error"] if n_err else ["warning"])]
        if len(bad):
            r = bad.iloc[0]
            subject = {"op": r.get("op") or "", "name": r.get("device_name") or "", "phase": r.get("phase") or "",
                       "level": "", "kind": "op", "module": r.get("module") or ""}
    if subject is not None:
        d.h("What to try next")
        base, backward = op_base(str(subject["op"] or ""), str(subject["name"] or ""))
        fam = family_of(str(subject["op"] or ""), str(subject["name"] or ""), str(subject["phase"] or ""))
        if subject["kind"] == "parameter":
            d.bullet("The weights differ before they are used: check checkpoint loading (dtype casts, "
                     "missing/unexpected keys), initialisation seeds, and the previous step's optimizer "
                     "update (compare step N-1's optimizer phase).")
        elif subject["kind"] == "input":
            d.bullet("The model inputs differ: check the data pipeline (shuffling, tokenisation, "
                     "augmentation randomness, dtype of the batch) on both sides.")
        elif subject["level"] == "module" or (str(subject["op"])[:1].isupper() and "." not in str(subject["op"])):
            d.bullet(f"This is a module-level record: the divergence is somewhere inside "
                     f"'{subject['module'] or subject['op']}'. Dump again at level='aten' (or 'mix') to "
                     "find the op inside it.")
        if backward or subject["phase"] == "backward":
            d.bullet(f"This is a backward computation ({base or subject['op']}'s gradient): the gradient "
                     "kernel diverged while the forward matched. Backward kernels use more atomics "
                     "and reductions than forward ones; the advice below applies to the gradient too.")
        if fam is not None:
            d.p(f"For {fam.title} ops ({base}):")
            for a in fam.advice:
                d.bullet(a)
        else:
            for a in GENERIC_ADVICE:
                d.bullet(a)
        if fam is None or fam.key not in ("nondeterministic", "random"):
            d.bullet("Rule out non-determinism first: dump the device twice and compare it with itself; "
                     "with `torch.use_deterministic_algorithms(True)` a correct kernel gives identical dumps.")

    # ---- reproduce -------------------------------------------------------------------------
    if rc is not None or n_err:
        d.h("Reproduce")
        case = _replay_case(summary, rc)
        if case:
            d.p("Re-run the op alone on both devices with the saved inputs:")
            d.p(f"    torchparity replay {case}")
        else:
            d.p("This comparison saved no replay case. To get one, run the model with online compare, "
                "which re-executes each op on the reference backend and saves the inputs of the ops that "
                "fail:")
            d.p("    import torchparity")
            d.p('    with torchparity.CompareWithReference(save_failures="cases/"):')
            d.p("        loss = model(batch); loss.backward()")
            d.p("then replay the failing op (the case of "
                + (f"'{rc.name}'" if rc is not None else "the first error") + "):")
            d.p("    torchparity replay cases/<case>")
    return d.text()


# ------------------------------------------------------------------------------------------
# the plugin
# ------------------------------------------------------------------------------------------




class AdvisorReporter(Reporter):
    """``OUT/advisor.txt``: where it diverged, why, and what to try next."""

    name = "advisor"
    description = "OUT/advisor.txt: root cause in plain words, the numbers, op-specific advice, how to replay"

    @dataclass
    class Options:
        #: file name inside the output directory
        filename: str = "advisor.txt"
        #: other suspects listed
        top_suspects: int = 5
        #: error rows listed when no root cause was named
        max_errors: int = 10
        #: line width for wrapping
        width: int = 100

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if not o.filename or Path(o.filename).name != o.filename:
            raise PluginError(f"reporter 'advisor': option filename={o.filename!r} must be a plain file name")
        if int(o.top_suspects) < 0 or int(o.max_errors) < 0 or int(o.width) < 40:
            raise PluginError("reporter 'advisor': top_suspects and max_errors must be >= 0 and width >= 40")

    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write ``advisor.txt`` into ``output_dir``; return ``[path]``."""
        out = prepare_output_dir(output_dir, self.name)
        text = advise(result, top_suspects=int(self.options.top_suspects), max_errors=int(self.options.max_errors),
                      width=int(self.options.width))
        path = out / self.options.filename
        tmp = path.with_name(path.name + ".tmp")
        try:  # a temporary file renamed into place: a full disk never leaves half a file
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise PluginError(f"reporter 'advisor': cannot write {path}: {exc.strerror or exc}") from None
        return [path]


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield AdvisorReporter()
