"""The rules of :class:`~torchparity.online.naninf.NanInfTracker`: which ops create, copy or
inherit a NaN/Inf, how a tensor is screened (exactly: never a value it does not hold), and the
small helpers that judge scalar arguments and outputs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: ``grad_fn.metadata`` key for backward attribution (separate from the dump's key so that the
#: dump's own tags, which carry record ids, are never pre-empted by ours)
_META_KEY = "torchparity.naninf"
_SENTINEL = 1 << 62
#: in-place ops whose destination is overwritten without being read (its old content is no input)
_OVERWRITING = frozenset({"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_",
                          "geometric_", "cauchy_", "log_normal_", "copy_", "set_", "resize_", "_foreach_zero_",
                          "_foreach_copy_"})
#: ops that copy their first argument's values unchanged (or widened)
_COPIES = frozenset({"clone", "_unsafe_view", "_to_copy", "contiguous", "lift_fresh_copy", "alias_copy",
                     "detach_copy", "view_copy", "_reshape_alias_copy"})
#: ops whose result is non-finite exactly where their first argument is, given a finite scalar
#: (``neg``: always; ``mul`` by ``|c| <= 1``; ``div`` by ``|c| >= 1``): they hand the screen on
_SCALED = {"neg": 0, "neg_": 0, "mul": 1, "mul_": 1, "div": 2, "div_": 2, "add": 3, "add_": 3, "sub": 3, "sub_": 3}
#: ``add``/``sub`` of a Python scalar below half an ulp of the dtype's largest value cannot
#: overflow (x + c rounds back to at most the largest finite value); bounds kept well inside
_SMALL_ADDEND = {torch.float16: 8.0, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e300}
#: ops that cannot turn finite inputs into a NaN/Inf: they select, move, compare or clip values
#: of their inputs (or fill in zeros/ones/their finite scalar arguments). Used on the CPU only
#: (trusted kernels), with every input known finite and every scalar in the output dtype's range.
_INHERITS = frozenset({
    "cat", "stack", "hstack", "vstack", "index_select", "embedding", "gather", "index", "_unsafe_index",
    "take", "masked_select", "where", "relu", "relu_", "threshold_backward", "abs", "abs_", "clamp", "clamp_",
    "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "hardtanh", "hardtanh_", "hardtanh_backward",
    "amax", "amin", "max", "min", "maximum", "minimum", "fmax", "fmin", "masked_fill", "masked_fill_",
    "masked_scatter", "masked_scatter_", "constant_pad_nd", "slice_backward", "select_backward",
    "index_put", "index_put_", "_index_put_impl_", "index_copy", "index_copy_", "index_fill", "index_fill_",
    "scatter", "scatter_", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    "flip", "roll", "repeat", "tril", "tril_", "triu", "triu_", "sort", "topk", "kthvalue", "narrow_copy",
    "diag", "diag_embed", "zeros", "ones", "zeros_like", "ones_like", "new_zeros", "new_ones", "zero_",
    "sign", "sgn", "ceil", "floor", "trunc", "frac", "sigmoid", "tanh", "relu6", "signbit",
    # bounded by their input (|silu(x)| <= |x|, |gelu(x)| <= |x|) or by 1 (softmax: exp(x - max) / sum >= 1)
    "silu", "silu_", "gelu", "gelu_", "hardswish", "hardswish_", "_softmax", "softmax",
})
#: uncounted ops whose output is their input (a new tensor object): the screen is handed on
_SAME = frozenset({"detach", "alias", "lift_fresh"})
#: float ranges: a cast to a dtype of higher rank (or the same) cannot overflow
_WIDTH = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
_FLOAT = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_STRIDED = torch.strided
#: screens kept on the device before an intermediate fold (bounds memory on very long steps)
_CHUNK = 32768
# op kinds
_SKIP, _UNCHECKED, _ALIAS, _CHECK = 0, 1, 2, 3
# host-side facts (CPU tensors): what the screen said; device tensors keep the 0-d screen itself
_FINITE, _INF, _NAN = 0, 1, 2
_EXTERNAL = -1  # producer step of a tensor no tracked op produced
#: fact of a CPU output whose screen is deferred (see NanInfTracker._resolve)
_PENDING = object()
#: elementwise ops and reductions whose result is non-finite wherever (one of) the listed
#: arguments is (IEEE: NaN and Inf propagate; inf*0, inf-inf give NaN): base -> argument positions
_PRESERVING = {"add": (0, 1), "sub": (0, 1), "mul": (0, 1), "div": (0,), "silu": (0,), "sqrt": (0,),
               "pow": (0,), "sum": (0,), "mean": (0,)}


_INF_ORD = float("inf")


def _screen(t: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor on ``t``'s device that is NaN if ``t`` holds a NaN, else Inf if it holds an
    Inf, else finite: ``max(|t|)`` (``vector_norm(t, inf)``, one reduction kernel, no temporary).

    Exact: it never overflows (the largest magnitude is a value ``t`` holds), so a tensor of
    finite values near the dtype's limit (a ``where(mask, 0, finfo.min)`` attention mask) is
    never reported. A ``sum`` overflowed to -inf on such masks.
    """
    return torch.linalg.vector_norm(t, _INF_ORD)


def _screen_many(ts: list[torch.Tensor], out: torch.Tensor) -> None:
    """:func:`_screen` of each of ``ts`` (float32/bfloat16/float16 values on one device) written
    into ``out`` (a 1-d float32 slice, one slot per value): one multi-tensor reduction
    (``_foreach_norm``, inf-norm: ``max(|t|)`` of each, exact) and one stack, for the whole
    list, instead of a reduction launched from Python per value (about 20 us of host time each
    on a GPU host, bench/results/session16/)."""
    torch.stack(torch._foreach_norm(ts, _INF_ORD), out=out)


def _host_fact(t: torch.Tensor) -> int:
    """What a CPU tensor holds, read at once: ``_FINITE``, ``_INF`` or ``_NAN`` (exact).

    The fast screen is a float32 (float64) ``sum``, one vectorised pass; it is non-finite when
    ``t`` holds a NaN/Inf *or* when finite values sum past the dtype's range (masks filled with
    ``finfo.min``), so a non-finite sum is confirmed by looking at the values (rare: two more
    passes, only for such tensors).
    """
    if t.numel() == 1:
        s = t.item()
    else:
        s = (torch.sum(t, dtype=torch.float32) if t.dtype == torch.float16 or t.dtype == torch.bfloat16
             else torch.sum(t)).item()
        if s - s != 0:  # NaN/Inf in t, or an overflowing sum of finite values: look
            if bool(torch.isnan(t).any()):
                return _NAN
            return _INF if bool(torch.isinf(t).any()) else _FINITE
    if s - s == 0:
        return _FINITE
    return _NAN if s != s else _INF


@dataclass(frozen=True)
class _OpInfo:
    """What the tracker needs to know about an op overload (computed once per overload)."""

    kind: int
    prefix: str  # Aten | Distributed
    base: str
    op: str
    first: int  # index of the first argument that is an input (1 when arg 0 is overwritten)
    out_only: frozenset  # positions and names of written arguments that are not inputs (out=)
    writes: tuple  # (position, name, is a list) of every written argument
    alias_src: int  # views/copies: position of the argument whose screen the outputs share (-1: none)
    scaled: int  # -1, or _SCALED's kind
    inherits: bool
    view: bool
    #: an op outside aten/prims (a collective, a custom op): its schema may not say what it writes
    foreign: bool = False
    #: GradScaler's check of the gradients (``_amp_foreach_non_finite_check_and_unscale_``)
    scaler_check: bool = False
    #: a collective (c10d, functional collectives): asynchronous, its outputs land when waited for
    collective: bool = False


#: -1 unless autograd's engine is running a backward on this thread
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _scales_down(kind: int, args: tuple, kwargs: dict) -> bool:
    """``neg``, ``mul`` by a finite Python scalar ``|c| <= 1``, ``div`` by ``|c| >= 1`` (no
    rounding mode), ``add``/``sub`` of a small ``c`` (no ``alpha``): the result is non-finite
    exactly where the input is."""
    if kind == 0:
        return len(args) == 1 and not kwargs
    if kind == 3:
        c = args[1] if len(args) == 2 and not kwargs else None
        if type(c) is not float and type(c) is not int:
            return False
        return -_SMALL_ADDEND.get(args[0].dtype, 0.0) <= c <= _SMALL_ADDEND.get(args[0].dtype, 0.0)
    if len(args) != 2 or (kwargs and set(kwargs) != {"rounding_mode"}):
        return False
    c = args[1]
    if type(c) is not float and type(c) is not int:
        return False
    if kind == 1:
        return -1.0 <= c <= 1.0
    return (c >= 1.0 or c <= -1.0) and not math.isinf(c) and kwargs.get("rounding_mode") is None


_FMAX: dict[torch.dtype, float] = {}


def _accumulates(base: str, args: tuple, kwargs: dict) -> bool:
    """``index_put(..., accumulate=True)`` and ``scatter(..., reduce=...)`` add values up: they
    can overflow, so they do not inherit."""
    if base in ("index_put", "index_put_", "_index_put_impl_"):
        return bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if base in ("scatter", "scatter_"):
        return any(type(a) is str for a in (*args, *kwargs.values()))
    return False


def _inherits_into(outs: list[torch.Tensor], widest: int) -> bool:
    """Inheritance needs CPU outputs (trusted kernels) no narrower than any float input (an
    ``index_put_`` of float32 values into float16 can overflow)."""
    for t in outs:
        if not t.is_cpu:
            return False
        w = _WIDTH.get(t.dtype)
        if w is not None and w < widest:
            return False
    return True


def _scalars_in_range(args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> bool:
    """Every Python float argument fits in the outputs' dtypes (else writing it overflows)."""
    lim = math.inf
    for t in outs:
        m = _FMAX.get(t.dtype)
        if m is None:
            m = _FMAX[t.dtype] = float(torch.finfo(t.dtype).max) if t.dtype.is_floating_point else math.inf
        lim = min(lim, m)
    for a in (*args, *kwargs.values()):
        if type(a) is float and not -lim <= a <= lim:
            return False
    return True


def _flat_tensors(x: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors in a module's output: a tensor, or nested lists/tuples/dicts (``ModelOutput``)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if depth > 4:
        return []
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y, depth + 1)]
    return []


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an op's output (a tensor, or a flat list/tuple of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res = []
        for x in out:
            if isinstance(x, torch.Tensor):
                res.append(x)
            elif isinstance(x, (list, tuple)):
                res.extend(y for y in x if isinstance(y, torch.Tensor))
        return res
    return []


def op_rules(si: Any) -> _OpInfo:
    """The tracker's rules for an overload (``si``: the op stream's
    :class:`~torchparity.capture.op_stream.OpInfo`), computed once per overload."""
    from ..capture import ops as opinfo
    from ..naninf_rule import AMP_UNSCALE_OP

    func, base, ns = si.func, si.base, si.namespace
    writes = si.writes
    schema = getattr(func, "_schema", None)
    out_only: set[Any] = set()
    for i, name, _ in writes:
        if schema is not None and schema.arguments[i].kwarg_only:
            out_only.update((i, name))
    if not si.counted:
        kind = _SKIP
    elif opinfo.is_uninitialised(func):
        kind = _UNCHECKED
    else:
        kind = _CHECK
    # views and copies hand their input's values on and cannot create a NaN/Inf: their
    # outputs share the input's screen; uninitialised results mean nothing
    alias = 1 if base == "copy_" else 0 if (si.view or base in _COPIES or base in _SAME) else -1
    return _OpInfo(kind=kind, prefix=si.prefix, base=base, op=si.op, first=1 if base in _OVERWRITING else 0,
                   out_only=frozenset(out_only), writes=writes, alias_src=alias,
                   scaled=_SCALED.get(base, -1) if ns == "aten" else -1,
                   inherits=base in _INHERITS and ns == "aten", view=si.view, foreign=ns not in ("aten", "prims"),
                   scaler_check=base == AMP_UNSCALE_OP,
                   collective=si.prefix == "Distributed")


def other_modes() -> bool:
    """May something below the tracker change what ops compute? A consumer of the op stream
    inside the observers (``layer > LAYER_OBSERVER``: the emulated device), or another
    TorchDispatchMode on the stack (any mode but the stream's own)."""
    from ..capture.op_stream import LAYER_OBSERVER, is_stream_mode, op_stream

    if any(c.layer > LAYER_OBSERVER for c in op_stream().consumers):
        return True
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return any(not is_stream_mode(m) for m in _get_current_dispatch_mode_stack())
    except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - be safe: no inheritance
        return True
