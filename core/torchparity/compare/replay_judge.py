"""Tensor mode: judge a suspect op by replaying it alone on its own recorded device inputs.

The statistics judge (:mod:`.rootcause`) blames an op whose output differs from the benchmark much
more than its inputs do. In a low-precision run that is not proof: an op can amplify an error
that arrived from upstream (a bf16 parameter update of a near-zero bias, a softmax on already
shifted logits) while computing exactly what it should from the values it was given. A
tensor-mode dump holds those values, so each suspect op is run again on the CPU, on its recorded
DEVICE inputs upcast to float64 (what a correctly rounded result would be), and the device's own
output is measured against it, in ulps of the output dtype (``torch.finfo(dtype).eps``):

* error within :data:`CONFIRM_ULP` ulp, or within :data:`CPU_MARGIN` times what the CPU's own
  kernel in the device dtype makes of the same inputs (a long reduction or a kernel that rounds
  several times carries more): the op did its job, the divergence arrived from upstream - the
  suspect is **cleared**;
* beyond that: the op introduced the error - **confirmed**, with the figures;
* not replayable (random ops, ops with side effects, a tensor or argument the dump does not
  hold, an op this torch does not have): "cannot replay: <why>", the statistics verdict stands.

At most ``limit`` ops are replayed per comparison: the suspects (earliest first), then, with what
is left, the strongest sub-threshold ops (amplification >= :data:`CANDIDATE_MIN`, highest first:
a x1.05 fault in a bf16 matmul scores ~5, below the threshold); a candidate replay confirms is
promoted to a suspect. The root cause becomes the earliest suspect that is not cleared, and the
``error`` output rows of every cleared op become ``warning`` (:func:`clear_rows`) so that the
verdicts, the summary and the exit code agree. Nothing is unpickled (tensors come from safetensors),
nothing runs on an accelerator, and op names resolve only inside allow-listed torch namespaces
(:func:`.replay_ops.resolve`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import DumpError
from ..results import Suspect
from .replay_ops import FLOATING, CannotReplay, build_call, resolve

log = logging.getLogger("torchparity")

#: ops replayed per comparison by default (``compare(..., replay=N)``, ``--replay N``)
DEFAULT_LIMIT = 20
#: an op below the suspect threshold whose amplification reaches this is replayed too (budget
#: permitting): a x1.05 fault in a bf16 matmul scores ~5, below the threshold (10); on the zoo
#: (docs/compare.md) x1.03 scores 2.7-3.1 and clean sub-threshold ops up to 3.3 (all cleared)
CANDIDATE_MIN = 2.0
#: an output farther than this from the float64 replay (normwise and max-norm, in ulps of its
#: dtype) introduced the error: a correctly rounded result is within 0.5 ulp
CONFIRM_ULP = 2.0
#: ... unless the CPU's own kernel in the same dtype is this many times less accurate still
CPU_MARGIN = 4.0
#: a replay reads at most this many input elements (a float64 copy of each on the CPU)
MAX_ELEMENTS = 1 << 26
#: ulp of fp32 matmuls under ``torch.set_float32_matmul_precision`` (tf32: 10 bits; bf16: 7)
_MATMUL_EPS = {"high": 2.0 ** -10, "medium": 2.0 ** -7}
_MATMULS = ("mm", "matmul", "linear", "addmm", "bmm", "baddbmm", "addbmm", "conv", "convolution", "_scaled_dot")

CONFIRMED, CLEARED, NOT_REPLAYED = "confirmed", "cleared", "not replayed"
#: the end of a cleared replay's reason (``_same_inputs`` takes it off again)
_UPSTREAM = ": the divergence arrived from upstream"


@dataclass
class Replay:
    """The replay verdict of one suspect op."""

    name: str
    op: str
    module: str
    phase: str
    step: int
    rank: int
    index: int
    verdict: str  # confirmed | cleared | not replayed
    reason: str
    error_ulp: float | None = None  # the device output's error against the float64 replay
    tolerance_ulp: float | None = None
    cpu_ulp: float | None = None  # the CPU kernel's own error in the device dtype (None: not run)
    dtype: str | None = None  # the output dtype the ulps are of

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- measuring ---------------------------------------------------------------------------------

def _upcast(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return x.to(torch.float64)
        if x.is_complex():
            return x.to(torch.complex128)
        return x.clone()
    if isinstance(x, torch.dtype) and x.is_floating_point:
        return torch.float64
    if isinstance(x, list):
        return [_upcast(v) for v in x]
    return x


def _copy(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


def _outputs(out: Any) -> dict[str, Any]:
    """Flattened outputs by index, as the capture names them (``flat_outputs``)."""
    import torch
    from torch.utils._pytree import tree_flatten

    if isinstance(out, torch.Tensor):
        return {"0": out}
    leaves, _ = tree_flatten(out)
    return {str(i): v for i, v in enumerate(leaves)}


def _run(call: Any, upcast: bool) -> dict[str, Any]:
    import torch

    conv = _upcast if upcast else _copy
    args, kwargs = [conv(a) for a in call.args], {k: conv(v) for k, v in call.kwargs.items()}
    if upcast and call.schema is not None:  # a float64 softmax has no half-to-float variant
        for i, a in enumerate(call.schema.arguments):
            if a.name == "half_to_float":
                if i < len(args):
                    args[i] = False
                elif a.name in kwargs:
                    kwargs[a.name] = False
    with torch.no_grad():
        return _outputs(call.fn(*args, **kwargs))


def error_ulp(dev: Any, ref: Any, eps: float) -> tuple[float, str]:
    """The error of ``dev`` against ``ref`` (float64) in ulps (``eps``): the larger of the normwise
    and the max-norm relative error; inf where NaN/Inf differ. Also a short note."""
    import torch

    d, r = dev.to(torch.float64).reshape(-1), ref.to(torch.float64).reshape(-1)
    fd, fr = torch.isfinite(d), torch.isfinite(r)
    if not bool(torch.equal(fd, fr)) or not bool(torch.equal(d[~fd].nan_to_num(1.0, 2.0, -2.0),
                                                             r[~fr].nan_to_num(1.0, 2.0, -2.0))):
        n = int((fd != fr).sum())
        return math.inf, f"{n} element(s) are NaN/Inf on one side only (device vs replay)"
    d, r = d[fd], r[fr]
    if not len(r):
        return 0.0, "no finite element"
    diff = d - r
    nr, mr = float(r.norm()), float(r.abs().max())
    nd, md = float(diff.norm()), float(diff.abs().max())
    if nr == 0.0:
        return (0.0, "") if nd == 0.0 else (math.inf, "the replay is all zeros, the device output is not")
    return max(nd / nr, md / mr) / eps, ""


def _eps(dtype: str, op: str, tolerance_dtype: str | None, matmul_precision: str | None) -> float:
    import torch

    e = float(torch.finfo(getattr(torch, dtype)).eps)
    if tolerance_dtype in FLOATING:
        e = max(e, float(torch.finfo(getattr(torch, tolerance_dtype)).eps))
    if dtype == "float32" and matmul_precision in _MATMUL_EPS and any(m in op for m in _MATMULS):
        e = max(e, _MATMUL_EPS[matmul_precision])
    return e


def replay_record(rec: Any, load: Any, *, tolerance_dtype: str | None = None,
                  matmul_precision: str | None = None) -> tuple[str, str, float | None, float | None,
                                                                  float | None, str | None]:
    """Replay one record (its rows of the full dump frame). Returns ``(verdict, reason,
    error_ulp, tolerance_ulp, cpu_ulp, dtype)``."""
    first = rec.iloc[0]
    op, level = str(first["op"]), str(first["level"])
    flags = first["flags"] if isinstance(first["flags"], dict) else {}
    try:
        if flags.get("random"):
            raise CannotReplay("it draws random numbers (a replay would draw others)")
        if flags.get("collective"):
            raise CannotReplay("it is a collective (its result depends on the other ranks)")
        if level != "aten" and str(first.get("phase")) == "backward":
            # the record holds the gradients of the call (grad_output in, grad_inputs out): running
            # the function on them would compare a forward result with a gradient
            raise CannotReplay(f"a {level}-level backward record is the gradient of {op}, not a call of it "
                               f"(dump at aten level to replay backward ops)")
        fn, schema = resolve(op, level)
        ins = rec[rec["io"] == "input"].to_dict("records")
        outs = [e for e in rec[rec["io"] == "output"].to_dict("records") if e["kind"] == "tensor"]
        saved = [e for e in outs if e.get("tensor") is not None and not isinstance(e.get("tensor"), float)]
        if not saved:
            raise CannotReplay("none of its outputs was saved (mode=tensor and io=output are needed)")
        if flags.get("inplace") and any(e["arg"] == "0" and e.get("producer") is not None and e.get("_view")
                                        for e in ins):
            raise CannotReplay("it writes in place into a view of another tensor")
        n = sum(math.prod(e["shape"] or ()) for e in ins if e["kind"] == "tensor" and e["shape"] is not None)
        if n > MAX_ELEMENTS:
            raise CannotReplay(f"its inputs hold {n} elements, more than a CPU float64 replay reads ({MAX_ELEMENTS})")
        unmeasured = flags.get("unmeasured") if isinstance(flags.get("unmeasured"), dict) else {}
        call = build_call(ins, fn, schema, load, unmeasured)
        try:
            ref = _run(call, upcast=True)
        except Exception as exc:  # an op without a float64 kernel, a recorded value it refuses
            raise CannotReplay(f"the op failed on the float64 inputs ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
        try:
            cpu = _run(call, upcast=False)
        except Exception:  # the CPU has no kernel in that dtype: judged on the ulp bound alone
            cpu = {}
        worst: tuple[float, float | None, str, str, str] | None = None
        for e in saved:
            r = ref.get(str(e["arg"]))
            if r is None or not hasattr(r, "shape"):
                continue
            dev = load(e["tensor"])
            if tuple(dev.shape) != tuple(r.shape):
                raise CannotReplay(f"the replay's output {e['arg']} has shape {tuple(r.shape)}, "
                                   f"the recorded one {tuple(dev.shape)}")
            dtype = str(e["dtype"])
            if dtype not in FLOATING:
                bad = int((dev != r.to(dev.dtype)).sum())
                err, note = (math.inf, f"{bad} of {dev.numel()} elements differ") if bad else (0.0, "")
                cpu_err = None
            else:
                eps = _eps(dtype, op, tolerance_dtype, matmul_precision)
                err, note = error_ulp(dev, r, eps)
                c = cpu.get(str(e["arg"]))
                cpu_err = error_ulp(c, r, eps)[0] if c is not None and hasattr(c, "shape") and \
                    tuple(c.shape) == tuple(r.shape) else None
            if worst is None or err > worst[0]:
                worst = (err, cpu_err, dtype, str(e["arg"]), note)
        if worst is None:
            raise CannotReplay("the replay returned none of the recorded outputs")
    except CannotReplay as exc:
        return NOT_REPLAYED, f"cannot replay: {exc}; the statistics verdict stands", None, None, None, None
    err, cpu_err, dtype, arg, note = worst
    tol = CONFIRM_ULP
    if cpu_err is not None and math.isfinite(cpu_err):
        tol = max(tol, CPU_MARGIN * cpu_err)
    cpu_txt = f"; the CPU kernel in {dtype}: {_f(cpu_err)} ulp" if cpu_err is not None else ""
    what = f"replayed in float64 on its own recorded inputs: its {dtype} output {arg} is off by {_f(err)} ulp " \
           f"(tolerance {_f(tol)} ulp{cpu_txt})"
    if note:
        what += f" ({note})"
    if err > tol:
        return CONFIRMED, f"{what}: this op introduced the error", err, tol, cpu_err, dtype
    return CLEARED, f"{what}{_UPSTREAM}", err, tol, cpu_err, dtype


def _same_inputs(cleared_reason: str) -> str:
    """The verdict of a suspect whose replay found its kernel right but whose inputs agree with the
    benchmark's exactly: nothing diverged upstream, so the call itself differs (a scalar argument,
    an op the benchmark does not run, a different op); the replay cannot clear it."""
    figures = cleared_reason.split(_UPSTREAM)[0]
    return (f"{figures}: its kernel computed its own call correctly, but its inputs agree with the benchmark's, "
            f"so the call itself differs (an argument, or an op the benchmark does not run)")


def _f(x: float | None) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


# ---- judging a comparison's suspects -----------------------------------------------------------

def _candidates(rows: Any, step: int, rank: int, threshold: float, taken: set[int], n: int) -> list[Suspect]:
    """The ``n`` strongest sub-threshold ops of one (step, rank): op records (aten or api level)
    whose amplification is at least :data:`CANDIDATE_MIN` but below ``threshold``, highest first,
    then earliest; as would-be suspects (not yet blamed: only a confirming replay promotes them)."""
    import numpy as np

    if n <= 0 or rows is None or not len(rows) or "amplification" not in rows:
        return []
    amp = rows["amplification"].to_numpy(dtype="float64")
    sel = ((rows["step"].to_numpy() == step) & (rows["rank"].to_numpy() == rank)
           & (rows["device_record_id"].to_numpy() >= 0) & np.isfinite(amp) & (amp >= CANDIDATE_MIN)
           & (amp < threshold) & (rows["level"].to_numpy() != "module"))
    if not sel.any():
        return []
    c = rows[sel].drop_duplicates("device_record_id")
    c = c[~c["order"].astype(int).isin(taken)]
    c = c.assign(_o=c["order"].astype(int)).sort_values(["amplification", "_o"], ascending=[False, True]).head(n)
    outs = rows[(rows["step"] == step) & (rows["rank"] == rank) & rows["device_record_id"].isin(c["device_record_id"])
                & rows["io"].isin(["output", "grad"]) & (rows["kind"] == "tensor")]
    out_err = outs.groupby("device_record_id")["error"].max()
    found = []
    for r in c.itertuples(index=False):
        oe = float(out_err.get(r.device_record_id, float("nan")))
        ie, fl = float(r.input_error), float(r.floor)
        stack = getattr(r, "stack", None)
        found.append(Suspect(
            name=str(r.device_name), op=str(r.op), module=str(r.module), phase=str(r.phase), step=step, rank=rank,
            index=int(r.order), score=float(r.amplification), input_error=ie, output_error=oe,
            reason=f"output error {_g(oe)} vs input error {_g(ie)} (floor {_g(fl)}): amplified {_g(r.amplification)}x, "
                   f"below the threshold {threshold:g} (a sub-threshold candidate)",
            bench_name=r.bench_name if isinstance(r.bench_name, str) else None, level=str(r.level), kind="op",
            stack=stack if isinstance(stack, list) else None))
    return found


def _g(x: float) -> str:
    return "nan" if x != x else f"{x:.3g}"


def judge_suspects(dev_path: Any, pair_sus: Sequence[list[Suspect]], per_pair: Sequence[dict[str, Any]], *,
                   limit: int = DEFAULT_LIMIT, tolerance_dtype: str | None = None, rows: Any = None,
                   threshold: float = 10.0) -> list[list[Suspect]]:
    """Replay up to ``limit`` ops of a tensor-mode comparison: its op suspects first (earliest
    first), then, with what is left of ``limit``, the strongest sub-threshold ops of ``rows``
    (amplification >= :data:`CANDIDATE_MIN`, highest first, then earliest).

    Returns each pair's suspects without the cleared ones, plus the candidates replay confirmed
    (promoted to suspects), the earliest first (as :func:`.rootcause.analyse` orders them);
    confirmed and unreplayable suspects get the replay's sentence added to their reason, a
    candidate that is cleared or cannot be replayed stays no suspect. Each pair's ``info`` gets
    ``replay`` (the :class:`Replay` dicts of its suspects and promoted candidates),
    ``replay_candidates`` (every candidate replayed), ``replay_s`` and its
    ``root_cause``/``suspects`` updated."""
    import time

    from ..dump.reader import TensorLoader, open_dump, read_unit
    from .suspects import _prefer_inner

    reader = open_dump(dev_path)
    budget = max(0, int(limit))
    todos: list[list[Suspect]] = []
    for sus in pair_sus:  # the suspects of every pair before any candidate
        todo = sorted((s for s in sus if s.kind == "op"), key=lambda s: s.index)[:budget]
        budget -= len(todo)
        todos.append(todo)
    cands: list[list[Suspect]] = []
    for sus, info in zip(pair_sus, per_pair):
        c = _candidates(rows, info["step"], info["rank"], threshold, {s.index for s in sus}, budget)
        budget -= len(c)
        cands.append(c)
    out: list[list[Suspect]] = []
    for sus, info, todo, cand in zip(pair_sus, per_pair, todos, cands):
        if not todo and not cand:
            out.append(list(sus))
            continue
        t0 = time.perf_counter()
        step, rank = info["step"], info["rank"]
        w: list[str] = []
        frame = read_unit(reader.unit(step, rank), w)
        numerics = ((reader.header(step, rank) or {}).get("backend") or {}).get("numerics") or {}
        mmp = numerics.get("float32_matmul_precision") if isinstance(numerics, dict) else None
        views = set(frame.loc[frame["flags"].map(lambda f: isinstance(f, dict) and bool(f.get("view"))), "record_id"])
        frame = frame.assign(_view=frame["producer"].map(lambda p: isinstance(p, tuple) and p[0] in views))
        by_id = {rid: g for rid, g in frame[frame["record_id"].isin([s.index for s in todo + cand])].groupby("record_id")}
        verdicts: dict[int, Replay] = {}
        todo_ids = {id(x) for x in todo}
        with TensorLoader() as loader:
            for s in todo + cand:
                rec = by_id.get(s.index)
                if rec is None or str(rec["name"].iat[0]) != s.name:
                    v = (NOT_REPLAYED, "cannot replay: the record is not in the device dump; the statistics verdict "
                                       "stands", None, None, None, None)
                else:
                    try:
                        v = replay_record(rec, loader.load, tolerance_dtype=tolerance_dtype, matmul_precision=mmp)
                    except DumpError as exc:  # an unreadable tensor file: say so, keep the verdict
                        v = (NOT_REPLAYED, f"cannot replay: {exc}; the statistics verdict stands", None, None, None, None)
                    if v[0] == CLEARED and s.input_error == 0 and id(s) in todo_ids:
                        # a suspect (above the threshold; a sub-threshold candidate on equal inputs
                        # may be a kernel's reassociation, which replay rightly clears)
                        v = (CONFIRMED, _same_inputs(v[1]),) + tuple(v[2:])
                verdicts[id(s)] = Replay(s.name, s.op, s.module, s.phase, s.step, s.rank, s.index, v[0], v[1],
                                         v[2], v[3], v[4], v[5])
        kept = []
        for s in sus:
            r = verdicts.get(id(s))
            if r is None:
                kept.append(s)
            elif r.verdict != CLEARED:
                kept.append(dataclasses.replace(s, reason=f"{s.reason}; {r.reason}"))
        promoted = [dataclasses.replace(s, reason=f"{s.reason}; {verdicts[id(s)].reason}") for s in cand
                    if verdicts[id(s)].verdict == CONFIRMED]
        kept = _prefer_inner(sorted(kept + promoted, key=lambda s: (s.index, -s.score)))
        info["replay"] = [verdicts[id(s)].to_dict() for s in todo]
        info["replay"] += [dict(verdicts[id(s)].to_dict(), candidate=True) for s in cand
                           if verdicts[id(s)].verdict == CONFIRMED]
        info["replay_candidates"] = [verdicts[id(s)].to_dict() for s in cand]
        info["replay_s"] = round(time.perf_counter() - t0, 3)
        info.update(root_cause=kept[0].name if kept else None, root_cause_index=kept[0].index if kept else None,
                    suspects=len(kept))
        out.append(kept)
    return out


def cleared(per_pair: Sequence[dict[str, Any]], candidates: bool = False) -> list[dict[str, Any]]:
    """The replays that cleared a suspect, over all pairs (``candidates``: also the sub-threshold
    candidates replay cleared)."""
    keys = ("replay", "replay_candidates") if candidates else ("replay",)
    return [r for p in per_pair for k in keys for r in p.get(k, []) if r["verdict"] == CLEARED]


def clear_rows(rows: Any, per_pair: Sequence[dict[str, Any]]) -> int:
    """The output rows of every op replay cleared (suspect or candidate) that a checker judged
    ``error`` become ``warning`` (in place), their reason the replay's figures: the tensor differs,
    but the error arrived from upstream, so the verdicts, the summary counts and the exit code
    agree with the root cause. Rows of ops replay did not judge keep their verdicts. Returns the
    rows changed."""
    import numpy as np
    import pandas as pd

    done = cleared(per_pair, candidates=True)
    if not done or not len(rows):
        return 0
    verdict = rows["verdict"].to_numpy(dtype=object).copy()
    reason = rows["reason"].to_numpy(dtype=object).copy()
    who = rows["checker"].to_numpy(dtype=object).copy()
    out = (rows["io"].isin(["output", "grad"]) & (rows["kind"] == "tensor")).to_numpy()
    step, rank, order = rows["step"].to_numpy(), rows["rank"].to_numpy(), rows["order"].to_numpy()
    changed = 0
    for r in done:
        hit = np.flatnonzero(out & (step == r["step"]) & (rank == r["rank"]) & (order == r["index"])
                             & (rows["device_name"].to_numpy() == r["name"]) & (verdict == "error"))
        if len(hit):
            verdict[hit] = "warning"
            reason[hit] = f"differs from the benchmark, but {r['name']} is not to blame: {r['reason']}"
            who[hit] = "replay"
            changed += len(hit)
    rows["verdict"] = pd.Series(verdict, index=rows.index, dtype=object)
    rows["reason"] = pd.Series(reason, index=rows.index, dtype=object)
    rows["checker"] = pd.Series(who, index=rows.index, dtype=object)
    return changed
