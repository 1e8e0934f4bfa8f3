"""Fair judging of one op output: device vs a same-dtype reference vs a high-precision reference.

The rule (issue 5): a low-precision device is not wrong because it rounds. Its error against the
high-precision (fp64) reference is compared with the error of a reference computed in the *same*
dtype; it fails only when it exceeds ``k`` times that (k = 2, 3 for fp16/bf16), and is also
outside the dtype's tolerance (torch.testing's table). Without a same-dtype reference (the
reference backend could not compute the dtype) the per-dtype tolerance alone decides.

The enabled checker plugins with the ``online`` scope (e.g. ``allclose``, whose plugins.yaml
options give per-op/per-dtype overrides) are asked first; this built-in judge is used when none is
installed, and for the parts every judgement needs (shapes, NaN/Inf positions, worst elements).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..capture import ops as opinfo
from ..plugin_types import VERDICT_RANK, CheckContext, CheckResult

#: torch.testing.assert_close defaults (rtol, atol)
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
}
#: unit roundoff: the smallest relative error a dtype can promise
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
LOW_PRECISION = frozenset({"float16", "bfloat16"})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass
class JudgeOptions:
    """Options of the built-in judge (the ``allclose`` checker has the same ones in plugins.yaml)."""

    k: float = 2.0
    k_low_precision: float = 3.0
    #: per-dtype overrides: {"bfloat16": [rtol, atol]}
    tolerance: dict = field(default_factory=dict)
    #: per-op overrides: [{"op": "aten.softmax*", "dtype": "bfloat16", "rtol": .., "atol": ..}]
    overrides: list = field(default_factory=list)

    def rtol_atol(self, dtype: str, op: str, name: str) -> tuple[float, float]:
        rtol, atol = self.tolerance.get(dtype, DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE["float32"]))
        for ov in self.overrides:
            if ov.get("dtype") not in (None, dtype):
                continue
            pat = str(ov.get("op", ""))
            if fnmatch.fnmatchcase(op, pat) or fnmatch.fnmatchcase(name, pat):
                rtol, atol = float(ov.get("rtol", rtol)), float(ov.get("atol", atol))
        return float(rtol), float(atol)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    nb = float(torch.linalg.vector_norm(b))
    nd = float(torch.linalg.vector_norm(a - b))
    if nb == 0.0:
        return 0.0 if nd == 0.0 else math.inf
    return nd / nb


def builtin_judge(device: torch.Tensor, same: torch.Tensor | None, high: torch.Tensor, dtype: str,
                  op: str, name: str, options: JudgeOptions) -> CheckResult:
    """Judge one floating output (all tensors on the CPU; ``device`` and ``same`` in ``dtype``)."""
    d, h = device.to(torch.float64), high.to(torch.float64)
    fin = torch.isfinite(h) & torch.isfinite(d)
    if same is not None:
        fin &= torch.isfinite(same.to(torch.float64))
    err_dev = rel_l2(d[fin], h[fin])
    rtol, atol = options.rtol_atol(dtype, op, name)
    diff = (d - h).abs()
    outside = int(((diff > atol + rtol * h.abs()) & fin).sum())
    metrics: dict[str, Any] = {"device_error": err_dev, "rtol": rtol, "atol": atol, "outside_tolerance": outside}
    if same is not None:
        err_same = rel_l2(same.to(torch.float64)[fin], h[fin])
        k = options.k_low_precision if dtype in LOW_PRECISION else options.k
        allowed = k * max(err_same, UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"]))
        metrics.update(reference_error=err_same, k=k, allowed=allowed)
        if err_dev > allowed and outside:
            return CheckResult("builtin", "error",
                               f"error vs fp64 reference {err_dev:.3g} > {k:g} x the same-dtype reference's "
                               f"{err_same:.3g}, {outside} of {d.numel()} elements outside rtol={rtol:g} atol={atol:g}",
                               metrics)
        return CheckResult("builtin", "pass", "", metrics)
    if outside:
        return CheckResult("builtin", "error", f"{outside} of {d.numel()} elements outside rtol={rtol:g} "
                           f"atol={atol:g} ({dtype}; no same-dtype reference)", metrics)
    return CheckResult("builtin", "pass", "", metrics)


def nonfinite_check(device: torch.Tensor, same: torch.Tensor | None, high: torch.Tensor) -> CheckResult | None:
    """NaN/Inf on the device where the fair reference has none (or the reverse): an error.
    NaN/Inf in both: a warning (the inputs carried them, or the dtype overflows there too)."""
    ref = same if same is not None else high
    dn, rn = ~torch.isfinite(device), ~torch.isfinite(ref)
    if not bool(dn.any()) and not bool(rn.any()):
        return None
    nd, nr = int(dn.sum()), int(rn.sum())
    if bool((dn != rn).any()) or bool((torch.isnan(device) != torch.isnan(ref)).any()):
        return CheckResult("nonfinite", "error", f"NaN/Inf differ: device has {nd} non-finite elements, "
                           f"the reference {nr}", {"device_nonfinite": nd, "reference_nonfinite": nr})
    return CheckResult("nonfinite", "warning", f"{nd} NaN/Inf elements, the same in the reference",
                       {"device_nonfinite": nd, "reference_nonfinite": nr})


def worst_elements(device: torch.Tensor, same: torch.Tensor | None, high: torch.Tensor, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` elements with the largest |device - fp64 reference| (non-finite ones first)."""
    d, h = device.to(torch.float64).reshape(-1), high.to(torch.float64).reshape(-1)
    if d.numel() == 0:
        return []
    diff = (d - h).abs()
    bad = ~torch.isfinite(d) & torch.isfinite(h)
    diff = torch.where(bad | torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    diff = torch.where(~torch.isfinite(d) & ~torch.isfinite(h), torch.zeros_like(diff), diff)
    top = torch.topk(diff, min(n, diff.numel())).indices.tolist()
    s = same.to(torch.float64).reshape(-1) if same is not None else None
    out = []
    for i in top:
        idx, rest = [], i
        for size in reversed(device.shape):
            rest, r = divmod(rest, size)
            idx.append(r)
        item = {"index": list(reversed(idx)), "device": _f(d[i]), "reference": _f(h[i])}
        if s is not None:
            item["same_dtype_reference"] = _f(s[i])
        out.append(item)
    return out


def _f(x: torch.Tensor) -> float | str:
    v = float(x)
    return v if math.isfinite(v) else str(v)


def judge_output(device: torch.Tensor, same: torch.Tensor | None, high: torch.Tensor | None, *, dtype: str,
                 op: str, name: str, checkers: Sequence[Any], options: JudgeOptions,
                 tie_sensitive: bool = False) -> CheckResult:
    """The verdict on one output tensor: shape, exactness for integers, NaN/Inf, then the enabled
    online checkers (or the built-in judge); the worst verdict wins."""
    if high is None or tuple(device.shape) != tuple(high.shape):
        return CheckResult("shape", "error", f"shape differs: device {tuple(device.shape)}, reference "
                           f"{None if high is None else tuple(high.shape)}")
    if not (device.dtype.is_floating_point or device.is_complex()):
        if tie_sensitive:
            return CheckResult("tie", "skip", "indices of a tie-sensitive op: values compared only")
        ref = same if same is not None else high
        equal = bool(torch.equal(device, ref.to(device.dtype)))
        return CheckResult("exact", "pass" if equal else "error", "" if equal else "integer/bool values differ")
    nf = nonfinite_check(device, same, high)
    if nf is not None and nf.verdict == "error":
        return nf
    results: list[CheckResult] = [nf] if nf is not None else []
    ctx = CheckContext(mode="online", op=op, dtype=dtype, extra={"name": name})
    for checker in checkers:
        try:
            r = checker.check_tensors(device, same if same is not None else high, ctx,
                                      reference_same_dtype=same, reference_high=high)
        except Exception as exc:  # a broken checker must not hide the op: say so and go on
            r = CheckResult(getattr(checker, "name", "?"), "warning", f"checker failed: {type(exc).__name__}: {exc}")
        results.append(r)
    if not checkers:
        results.append(builtin_judge(device, same, high, dtype, op, name, options))
    worst = max(results, key=lambda r: VERDICT_RANK.get(r.verdict, 0))
    metrics: dict[str, Any] = {}
    for r in results:
        metrics.update(r.metrics)
    return CheckResult(worst.checker, worst.verdict, worst.reason, metrics)


@dataclass
class OpVerdict:
    """The worst output of one op: its index, the verdict and its worst elements."""

    output: int
    result: CheckResult
    worst: list[dict[str, Any]] = field(default_factory=list)


def judge_outputs(func: Any, name: str, device_outs: Sequence[torch.Tensor | None],
                  same_outs: Sequence[torch.Tensor | None], high_outs: Sequence[torch.Tensor | None], *,
                  same_dtype: Any, checkers: Sequence[Any], options: JudgeOptions, n_worst: int = 5) -> OpVerdict | None:
    """Judge every output of one op; the worst verdict wins (``None``: nothing was judged).

    Floating device outputs are judged in the device's compute dtype ``same_dtype(dtype)`` (for an
    emulated bf16 device: bf16, exactly representing its values)."""
    tie = opinfo.is_tie_sensitive(func)
    op = str(func)
    worst: tuple[int, CheckResult, torch.Tensor, Any, Any] | None = None
    for i, d in enumerate(device_outs):
        if d is None or i >= len(same_outs) or same_outs[i] is None:
            continue
        dcpu = d.detach().to("cpu")
        same, high = same_outs[i], high_outs[i]
        jdtype = dcpu.dtype
        if dcpu.dtype.is_floating_point:
            jdtype = same_dtype(dcpu.dtype)
            dcpu = dcpu.to(jdtype)
            same = same.to(jdtype) if same.dtype.is_floating_point else same
        r = judge_output(dcpu, same, high, dtype=dtype_name(jdtype), op=op, name=name,
                         checkers=checkers, options=options, tie_sensitive=tie)
        if r.verdict == "skip":
            continue
        if worst is None or VERDICT_RANK[r.verdict] > VERDICT_RANK[worst[1].verdict]:
            worst = (i, r, dcpu, same, high)
    if worst is None:
        return None
    i, r, dcpu, same, high = worst
    elems: list[dict[str, Any]] = []
    if r.verdict != "pass" and dcpu.dtype.is_floating_point and high is not None and tuple(high.shape) == tuple(dcpu.shape):
        elems = worst_elements(dcpu, same, high, n_worst)
    return OpVerdict(i, r, elems)
