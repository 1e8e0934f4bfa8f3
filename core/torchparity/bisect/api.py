"""``torchparity.bisect(script, entry=..., step=...)``: prove which modules/ops cause a divergence.

Runs the entry function once as the reference and once as the target, then re-runs the target with
sets of units promoted (see :mod:`.promote`), searching first over the modules (in execution order,
so neighbouring units are neighbouring subtrees), then over the ops of the culprit modules
(:mod:`.search`). With a compare's root cause, its module and then its op are tried alone first:
when one fixes the run on its own it is the answer (one re-run instead of a search). Every verdict comes from a re-run judged by :mod:`.judge`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from .judge import default_tolerance, flatten_outputs, output_error
from .promote import OpKey, describe_op, op_key, target_context
from .report import BisectReport, compare_root_cause
from .script import call_entry, load_entry, pick_step
from .search import Diffuse, Probe, minimal_set

TARGETS = ("emulated:bfloat16", "emulated:float16", "native")


def _check_target(target: str) -> str:
    aliases = {"emulated": "emulated:bfloat16", "emulated:bf16": "emulated:bfloat16",
               "emulated:fp16": "emulated:float16", "bf16": "emulated:bfloat16", "fp16": "emulated:float16"}
    t = aliases.get(target, target)
    if t not in TARGETS:
        raise UsageError(f"bisect: target must be one of {', '.join(TARGETS)}, got {target!r}")
    return t


def bisect(script: str | Path, entry: str = "main", step: int = 0, target: str = "emulated:bfloat16",
           tolerance: float | None = None, promote_dtype: str = "float32", seed: int = 0,
           output_dir: str | Path | None = None, compare_dir: str | Path | None = None,
           max_culprits: int = 8, promote_backend: str | None = None) -> BisectReport:
    """Find the smallest set of modules, then ops, whose promotion removes a divergence.

    Args:
        script: a Python file defining ``entry``.
        entry: the function to run; it returns the output to judge (or a list of them, one per step).
        step: which step's output to judge.
        target: ``emulated:bfloat16`` / ``emulated:float16`` (the entry runs under the emulated
            device; the reference is the same call without it), or ``native`` (the entry is called
            with ``target=True`` for the target run, ``target=False`` for the reference).
        tolerance: the error (relative L2 of the step's outputs) below which the divergence is
            removed; default: the compare's noise floor for the target's dtype.
        promote_dtype: ``float32`` or ``float64`` (native targets; emulated targets compute promoted
            ops at the model's own precision).
        seed: seed of every run (Python, NumPy, torch).
        output_dir: where to write ``bisect-report.json`` (None: not written).
        compare_dir: a compare output directory whose root cause the report carries.
        max_culprits: the search stops when this many modules (or ops) are found and do not yet
            remove the divergence: verdict ``diffuse`` (spread over many units), with those found.
        promote_backend: compute promoted ops on this backend's device (``cpu``: the reference),
            in their own dtypes, instead of in a higher precision: finds a device kernel that
            computes wrongly rather than a rounding problem (:mod:`.promote_reference`).
    """
    import torch

    target = _check_target(target)
    if promote_dtype not in ("float32", "float64"):
        raise UsageError(f"bisect: promote dtype must be float32 or float64, got {promote_dtype!r}")
    if step < 0:
        raise UsageError(f"bisect: step must be >= 0, got {step}")
    if isinstance(max_culprits, bool) or not isinstance(max_culprits, int) or max_culprits < 1:
        raise UsageError(f"bisect: max culprits must be a whole number >= 1, got {max_culprits!r}")
    if tolerance is not None and not tolerance > 0:
        raise UsageError(f"bisect: tolerance must be a positive number, got {tolerance!r}")
    promote_device = None
    if promote_backend is not None:
        from .promote_reference import reference_device

        promote_device = reference_device(promote_backend)
    rc = compare_root_cause(compare_dir) if compare_dir is not None else None
    not_promoted: dict[str, int] = {}  # ops chosen for promotion that ran unpromoted (every re-run)
    fn = load_entry(script, entry)
    native = target == "native"
    pdtype = getattr(torch, promote_dtype)
    dtype_name = target.partition(":")[2] or "bfloat16"
    tol = float(tolerance) if tolerance is not None else default_tolerance(dtype_name)
    sname = str(script)

    def outputs(target_run: bool, promote: Callable[[Any], bool] | None) -> list[Any]:
        if not target_run:
            out = call_entry(fn, seed, False if native else None)
        else:
            with target_context(target, promote or (lambda c: False), pdtype, promote_device, not_promoted):
                out = call_entry(fn, seed, True if native else None)
        return flatten_outputs(pick_step(out, step, sname))

    reference = outputs(False, None)
    modules: dict[str, None] = {}
    ops: dict[OpKey, None] = {}

    def record(call: Any) -> bool:
        key = op_key(call)
        modules.setdefault(key[0], None)
        ops.setdefault(key, None)
        return False

    base_err = output_error(outputs(True, record), reference)
    report = BisectReport(verdict="no_divergence", script=sname, entry=entry, step=step, target=target,
                          promote_dtype=promote_dtype, tolerance=tol, baseline_error=base_err, runs_total=2,
                          n_modules=len(modules), n_ops=len(ops), compare_root_cause=rc, seed=seed,
                          promote_backend=promote_backend, not_promoted=not_promoted)
    path: list[Probe] = []

    def probe(level: str, names: list[str], pred: Callable[[Any], bool]) -> bool:
        err = output_error(outputs(True, pred), reference)
        fixed = err <= tol
        path.append(Probe(level, names, err, fixed))
        report.reruns += 1
        report.runs_total += 1
        return fixed

    if base_err <= tol:
        return _finish(report, path, output_dir)
    if not probe("all", ["(every op)"], lambda c: True):
        report.verdict = "not_precision"
        report.error_after_promotion = path[-1].error
        return _finish(report, path, output_dir)

    mod_list = list(modules)
    cache: dict[frozenset, bool] = {}

    def fixes_modules(sel: list[str], level: str = "modules") -> bool:
        key = frozenset(sel)
        if key not in cache:
            chosen = set(sel)
            cache[key] = probe(level, sel, lambda c: c.module in chosen)
        return cache[key]

    # the compare's root cause, when given, is the first hypothesis: promoted alone, does it fix?
    hint_mod = (rc.get("module") or "") if rc else None
    hint_op = (hint_mod, rc.get("name")) if rc and rc.get("name") else None

    try:
        culprit_mods = (_alone(mod_list, lambda sel: fixes_modules(sel, "modules (compare's root cause)"), hint_mod)
                        or minimal_set(mod_list, fixes_modules, max_culprits))
    except Diffuse as d:
        return _diffuse(report, path, output_dir, d.found, [])
    in_mods = set(culprit_mods)
    op_list = [k for k in ops if k[0] in in_mods]
    op_cache: dict[frozenset, bool] = {}

    def fixes_ops(sel: list[OpKey], level: str = "ops") -> bool:
        key = frozenset(sel)
        if key not in op_cache:
            chosen = set(sel)
            op_cache[key] = probe(level, [describe_op(k) for k in sel], lambda c: op_key(c) in chosen)
        return op_cache[key]

    try:
        culprit_ops = ((_alone(op_list, lambda sel: fixes_ops(sel, "ops (compare's root cause)"), hint_op)
                        or minimal_set(op_list, fixes_ops, max_culprits)) if op_list else [])
    except Diffuse as d:
        return _diffuse(report, path, output_dir, culprit_mods, [describe_op(k) for k in d.found])
    report.verdict = "culprit"
    report.culprit_modules = sorted({k[0] for k in culprit_ops}, key=mod_list.index) or culprit_mods
    report.culprit_ops = [describe_op(k) for k in culprit_ops]
    # the last fixing probe is the culprit set itself (minimal_set verifies it, or it is the known-fixing set)
    fixing = [p for p in path if p.fixed]
    report.error_after_promotion = fixing[-1].error if fixing else None
    return _finish(report, path, output_dir)


def _alone(units: list[Any], fixes: Callable[[list[Any]], bool], hint: Any) -> list[Any] | None:
    """``[hint]`` when ``hint`` is one of several ``units`` and promoting it alone fixes the run
    (one re-run: a single unit that fixes is a minimal set); None otherwise (the search goes on,
    the re-run spent)."""
    if hint is not None and len(units) > 1 and hint in units and fixes([hint]):
        return [hint]
    return None


def _diffuse(report: BisectReport, path: list[Probe], output_dir: str | Path | None, modules: list[str],
             ops: list[str]) -> BisectReport:
    """Verdict ``diffuse``: ``max_culprits`` units found one by one do not remove the divergence."""
    report.verdict = "diffuse"
    report.culprit_modules, report.culprit_ops = list(modules), ops
    report.error_after_promotion = path[-1].error  # the re-run of the units found so far, together
    return _finish(report, path, output_dir)


def _finish(report: BisectReport, path: list[Probe], output_dir: str | Path | None) -> BisectReport:
    report.path = [p.to_dict() for p in path]
    report.not_promoted = dict(sorted(report.not_promoted.items()))
    if output_dir is not None:
        report.write(output_dir)
    return report
