"""``torchparity.compare``: pair two dumps, measure every tensor, judge, find the root cause.

Pipeline per (step, rank) present in both dumps (in parallel processes for big multi-rank or
multi-step dumps): read both sides (:mod:`torchparity.dump.reader`), pair records and tensors
(:mod:`.matching`), compute statistics/checksum metrics vectorised and full-tensor metrics where
both tensors were saved (:mod:`.metrics`), score each op's amplification (:mod:`.rootcause`).
Then the checker plugins give each row a verdict (:mod:`.judge`) and the reporter plugins write
the requested formats.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import DumpError, TorchparityError, UsageError
from ..results import CompareResult, Suspect
from ..workers import automatic_workers_allowed, map_jobs
from . import compiled, integrity, loss_scale, matching, rootcause, scaler_skips, scaler_tail
from .suspects import rank_suspects
from .judge import judge
from .rows import MIN_PAIRED_FRACTION  # noqa: F401  (re-exported: the documented constant)
from .rows import add_tensor_metrics as _add_tensor_metrics
from .rows import build_rows as _build_rows
from .rows import check_same_computation as _check_same_computation
from .rows import check_same_modules as _check_same_modules
from .rows import check_same_shapes as _check_same_shapes
from .summary import incomplete_warnings, report, summary

log = logging.getLogger("torchparity")

#: compare pairs in worker processes when there are several and at least this many records in all
PARALLEL_MIN_ROWS = 200_000
#: header fields that should match for a like-for-like comparison (a difference is a warning)
HEADER_CHECKS = ("level", "mode")
BACKEND_CHECKS = ("torch_version", "numerics")


def compare(
    device_dump: str | os.PathLike[str],
    bench_dump: str | os.PathLike[str],
    output_dir: str | os.PathLike[str] | None = None,
    step: int | None = None,
    rank: int | None = None,
    formats: str | Sequence[str] | None = None,
    layer_mapping: str | os.PathLike[str] | Mapping[str, str] | None = None,
    plugins: str | os.PathLike[str] | Any | None = None,
    *,
    threshold: float = rootcause.DEFAULT_THRESHOLD,
    tolerance_dtype: str | None = None,
    workers: int | None = None,
    allow_partial: bool = False,
    replay: int = 20,
) -> CompareResult:
    """Compare a device dump with a benchmark dump.

    :param device_dump: the dump under test (torchparity or msprobe; root, step or rank directory).
    :param bench_dump: the benchmark dump (usually CPU / a trusted device).
    :param output_dir: where reporters write (nothing is written when None).
    :param step: compare only this step; :param rank: only this rank (default: all common ones).
    :param formats: reporter names (``"log,xlsx"`` or a list). Default: every enabled reporter.
    :param layer_mapping: YAML file or dict ``{device_module_name: bench_module_name}``.
    :param plugins: a plugins.yaml path or a :class:`~torchparity.plugins.Registry`.
    :param threshold: amplification at which an op becomes a suspect (default 10).
    :param tolerance_dtype: judge noise as if the device computed in this dtype (e.g.
        ``"bfloat16"`` for an emulated-bf16 run whose tensors are stored as float32).
    :param workers: worker processes for multi-step/rank dumps (default: automatic, and from a
        script only when asked: :mod:`torchparity.workers`).
    :param allow_partial: compare what can be read of a truncated/corrupt dump (default: refuse
        it with a :class:`DumpError` that says what was read and what was lost).
    :param replay: tensor mode: replay up to this many suspect ops alone on their recorded device
        inputs in float64 to confirm or clear them (:mod:`.replay_judge`; 0: off).
    :returns: a :class:`~torchparity.results.CompareResult`.
    :raises DumpError: a dump is missing, empty, damaged (unless ``allow_partial``), the two share
        no step/rank, or they do not record the same computation.
    """
    from ..dump.reader import open_dump
    from ..dump.schedule import like_pairs

    t0 = time.perf_counter()
    if not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or threshold <= 1:
        raise UsageError(f"threshold must be a finite number > 1 (an amplification factor), got {threshold}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UsageError(f"workers must be a whole number >= 1 (or None: automatic), got {workers!r}")
    if isinstance(replay, bool) or not isinstance(replay, int) or replay < 0:
        raise UsageError(f"replay must be a whole number >= 0 (suspects to replay; 0: off), got {replay!r}")
    for name, val in (("step", step), ("rank", rank)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 0):
            raise UsageError(f"{name} must be a whole number >= 0, got {val!r}")
    if tolerance_dtype is not None and tolerance_dtype not in rootcause.DTYPE_RTOL:
        raise UsageError(f"unknown tolerance dtype '{tolerance_dtype}'; use one of {', '.join(rootcause.DTYPE_RTOL)}")
    mapping = matching.load_layer_mapping(layer_mapping)
    reg = _registry(plugins)
    _refuse_bad_checker_options(reg)
    dev = open_dump(device_dump)
    ben = open_dump(bench_dump)
    warnings: list[str] = [f"device dump: {w}" for w in dev.warnings] + [f"bench dump: {w}" for w in ben.warnings]

    dkeys = {(u.step, u.rank) for u in dev.units}
    bkeys = {(u.step, u.rank) for u in ben.units}
    if step is not None or rank is not None:
        sel = lambda k: (step is None or k[0] == step) and (rank is None or k[1] == rank)  # noqa: E731
        dkeys, bkeys = {k for k in dkeys if sel(k)}, {k for k in bkeys if sel(k)}
        if not dkeys or not bkeys:
            side = "device" if not dkeys else "bench"
            raise DumpError(
                f"the {side} dump has no step={step} rank={rank}; device has {_units(dev)}, bench has {_units(ben)}")
    common = sorted(dkeys & bkeys)
    if not common:
        raise DumpError(
            f"the dumps share no (step, rank): device has {_units(dev)}, bench has {_units(ben)}; "
            f"pass --step/--rank or dump the same steps on both sides")
    lost = _lost_units(dev, ben, sel if step is not None or rank is not None else None)
    if lost and not allow_partial:
        raise DumpError(f"{lost[0]}" + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else "")
                        + "; restore it, compare the steps that are there with --step, or pass --allow-partial "
                          "(allow_partial=True) to compare the rest")
    warnings += lost
    common, unlike = like_pairs(dev, ben, common)  # a full step never faces a light one
    if not common:
        raise DumpError(f"the dumps share no step recorded alike ({'; '.join(unlike[:2])}); "
                        f"pass --step for a step both captured fully, or dump both with the same steps/every")
    warnings += unlike
    for side, reader, only in (("device", dev, dkeys - bkeys), ("bench", ben, bkeys - dkeys)):
        for k in sorted(only):
            warnings.append(scaler_tail.tail_line(side, *k) if scaler_tail.is_scaler_tail(reader, *k)
                            else f"step{k[0]}/rank{k[1]} exists only in the {side} dump; not compared")
    warnings += _header_warnings(dev, ben, common)
    if tolerance_dtype is None:
        tolerance_dtype = emulated_dtype(dev, common)
        if tolerance_dtype is not None:
            warnings.append(f"the device dump was produced by an emulated device computing in {tolerance_dtype}: "
                            f"its tensors are judged against {tolerance_dtype} rounding")
        elif emulated_dtype(ben, common) is not None:
            warnings.append(f"the bench dump was produced by an emulated device ({emulated_dtype(ben, common)}): "
                            f"is it the benchmark you meant?")

    why = compiled.random_mismatch([(dev.header(s, r) or {}, ben.header(s, r) or {}) for s, r in common])
    if why:
        raise UsageError(why)
    jobs = [(str(dev.path), str(ben.path), s, r, mapping, threshold, tolerance_dtype, allow_partial) for s, r in common]
    results = _run_jobs(jobs, workers, dev, ben)

    import pandas as pd

    frames, pair_sus, per_pair = [], [], []
    for (s, r), res in zip(common, results):
        if isinstance(res, TorchparityError):
            raise res
        rows_sr, sus, w, info = res
        warnings += w
        frames.append(rows_sr)
        pair_sus.append(sus)
        per_pair.append(info)
    rows = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else frames[0]
    if not len(rows):
        raise DumpError(
            f"nothing to compare: both dumps are empty for {', '.join(f'step{s}/rank{r}' for s, r in common)}"
            + (f" ({'; '.join(warnings[:3])})" if warnings else ""))

    mode = _mode(rows)
    checkers = reg.checkers_for("compare") if reg is not None else []
    with no_gc():
        rows, problems = judge(rows, checkers, mode)
    warnings += problems
    integrity.apply_not_compared(rows)
    scaler_skips.apply(rows)
    compiled.skip_one_sided(rows, {k for k, info in zip(common, per_pair) if info.get("compiled")})
    # a suspect whose output a checker passes (a tolerance the user configured) is no suspect;
    # every other suspect's output is an error: verdicts and root cause never disagree
    accepted = integrity.accepted_by_checkers(rows, [x for sus in pair_sus for x in sus])
    if accepted:
        gone = {id(x) for x, _ in accepted}
        warnings.append(f"{len(accepted)} op(s) amplify the error beyond the threshold but a checker passes them "
                        f"(configured tolerances), so they are not suspects (first: {accepted[0][0].name}, passed by "
                        f"'{accepted[0][1]}')")
        pair_sus = [[x for x in sus if id(x) not in gone] for sus in pair_sus]
        for info, sus in zip(per_pair, pair_sus):
            info.update(root_cause=sus[0].name if sus else None, root_cause_index=sus[0].index if sus else None,
                        suspects=len(sus))
    if replay and mode == "tensor":  # confirm or clear each suspect (and strong sub-threshold op) by replaying it
        from . import replay_judge

        pair_sus = replay_judge.judge_suspects(dev.path, pair_sus, per_pair, limit=replay,
                                               tolerance_dtype=tolerance_dtype, rows=rows, threshold=threshold)
        replay_judge.clear_rows(rows, per_pair)  # a cleared op's error rows: warnings (error from upstream)
    suspects = [x for sus in pair_sus for x in sus]
    integrity.agree_with_suspects(rows, suspects)

    root = _first([sus[0] for sus in pair_sus if sus])  # each pair's root cause: innermost, earliest
    ranked = rank_suspects(([root] if root else []) + [s for s in suspects if s is not root])
    s = summary(rows, dev, ben, mode, root, per_pair, warnings, threshold, checkers, time.perf_counter() - t0,
                lost=lost)
    warnings += incomplete_warnings(rows, s)
    result = CompareResult(rows=rows, summary=s, root_cause=root, suspects=ranked,
                           output_dir=Path(output_dir) if output_dir is not None else None)
    report(result, reg, formats, warnings)
    s["warnings"] = warnings
    return result


def _lost_units(dev: Any, ben: Any, sel: Any) -> list[str]:
    """A line per step directory a dump lost (its rank wrote it, a later header says so), within
    the ``sel`` filter of (step, rank)."""
    from ..dump.reader import lost_reason

    out = []
    for side, reader in (("device", dev), ("bench", ben)):
        for s, r, by in reader.lost_units():
            if sel is None or sel((s, r)):
                out.append(f"the {side} dump is missing step{s}/rank{r}: {lost_reason(r, by)}")
    return out


def _units(r: Any) -> str:
    return ", ".join(f"step{u.step}/rank{u.rank}" for u in r.units) or "nothing"


def _first(suspects: list[Suspect]) -> Suspect | None:
    """The first divergence among the pairs' root causes: lowest step, then the earliest op, then
    the lowest rank."""
    if not suspects:
        return None
    return min(suspects, key=lambda s: (s.step, s.index, s.rank))


#: keys of a dump header's ``backend`` environment that name the precision an emulating device
#: computed in (the emulated backend writes ``emulated_dtype``)
EMULATED_DTYPE_KEYS = ("emulated_dtype", "emulate_dtype", "compute_dtype")


def emulated_dtype(reader: Any, common: list[tuple[int, int]]) -> str | None:
    """The reduced precision a dump's device emulated (from its header), or None."""
    for s, r in common[:1]:
        env = (reader.header(s, r) or {}).get("backend") or {}
        if not isinstance(env, dict):
            return None
        for k in EMULATED_DTYPE_KEYS:
            v = env.get(k)
            if isinstance(v, str) and v:
                v = v.replace("torch.", "")
                if v in rootcause.DTYPE_RTOL and v not in ("float32", "float64"):
                    return v
    return None


def _header_warnings(dev: Any, ben: Any, common: list[tuple[int, int]]) -> list[str]:
    out: list[str] = []
    s, r = common[0]
    hd, hb = dev.header(s, r) or {}, ben.header(s, r) or {}
    for k in HEADER_CHECKS:
        if k in hd and k in hb and hd[k] != hb[k]:
            out.append(f"the dumps differ in {k}: device {hd[k]!r}, bench {hb[k]!r}; records may pair poorly - dump both the same way")
    bd, bb = hd.get("backend") or {}, hb.get("backend") or {}
    for k in BACKEND_CHECKS:
        if k in bd and k in bb and bd[k] != bb[k]:
            if isinstance(bd[k], dict) and isinstance(bb[k], dict):
                diff = sorted(x for x in set(bd[k]) & set(bb[k]) if bd[k].get(x) != bb[k].get(x))
                if diff:
                    out.append(f"numerics switches differ: {', '.join(f'{x}={bd[k].get(x)!r}/{bb[k].get(x)!r}' for x in diff)} "
                               f"(device/bench); the runs are not set up alike")
            else:
                out.append(f"{k} differs: device {bd[k]!r}, bench {bb[k]!r}")
    if hd and hb and hd.get("format") != hb.get("format"):
        out.append(f"comparing a {hd.get('format', dev.format)} dump with a {hb.get('format', ben.format)} dump")
    return out


def _registry(plugins: Any) -> Any:
    from ..plugins import Registry, get_registry

    if isinstance(plugins, Registry):
        return plugins
    try:
        return get_registry(str(plugins) if plugins is not None else None)
    except TorchparityError:
        raise
    except Exception as exc:  # pragma: no cover - defensive
        log.warning("plugin discovery failed (%s); comparing with built-in rules", exc)
        return None


def _refuse_bad_checker_options(reg: Any) -> None:
    """A compare checker that plugins.yaml configures wrongly is refused, not silently left out
    (its verdicts would be missing while the summary read as if it had judged)."""
    if reg is None:
        return
    for c in reg.components:
        if c.kind == "checker" and not c.enabled and c.why_disabled.startswith("bad options") \
                and "compare" in getattr(c.component, "scopes", ()):
            where = reg.config.path or "plugins.yaml"
            why = c.why_disabled[len("bad options:"):].strip()
            raise UsageError(f"{where}: {why}; fix that option, or disable the checker (plugins: disable: [{c.name}])")


def _run_jobs(jobs: list[tuple[Any, ...]], workers: int | None, dev: Any, ben: Any) -> list[Any]:
    n = len(jobs)
    if workers is None:
        size = sum((u.path / "records.jsonl").stat().st_size if (u.path / "records.jsonl").is_file() else
                   ((u.path / "dump.json").stat().st_size if (u.path / "dump.json").is_file() else 0) for u in dev.units)
        workers = min(n, os.cpu_count() or 1) if n > 1 and size > PARALLEL_MIN_ROWS * 300 \
            and automatic_workers_allowed() else 1
    return map_jobs(_compare_pair_safe, jobs, workers)


def _compare_pair_safe(job: tuple[Any, ...]) -> Any:
    try:
        with no_gc():
            return compare_pair(*job)
    except TorchparityError as exc:
        return exc


class no_gc:
    """Pause the cyclic garbage collector while a dump is read and compared.

    Reading builds millions of small, long-lived containers (one dict per record and tensor);
    each collection then walks all of them, which made reading 100k records ~4x slower than the
    JSON parsing itself. Nothing here creates reference cycles that need the collector, and it is
    re-enabled (if it was enabled) on exit."""

    def __enter__(self) -> None:
        import gc

        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        import gc

        if self._was:
            gc.enable()


# ---------------------------------------------------------------------------------------------
# one (step, rank)
# ---------------------------------------------------------------------------------------------


def compare_pair(dev_path: str, bench_path: str, step: int, rank: int, mapping: Mapping[str, str],
                 threshold: float, tolerance_dtype: str | None,
                 allow_partial: bool = False) -> tuple[Any, list[Suspect], list[str], dict[str, Any]]:
    """Compare one (step, rank). Returns (rows, suspects, warnings, info)."""
    from ..dump.reader import open_dump, read_unit

    warnings: list[str] = []
    dr, br = open_dump(dev_path), open_dump(bench_path)
    dw: list[str] = []
    bw: list[str] = []
    d = read_unit(dr.unit(step, rank), dw, compact=True)
    b = read_unit(br.unit(step, rank), bw, compact=True)
    integrity.clean_identity(d, f"step{step}/rank{rank}", dw)
    integrity.clean_identity(b, f"step{step}/rank{rank}", bw)
    warnings += [f"device dump: {w}" for w in dw] + [f"bench dump: {w}" for w in bw]
    from ..dump.reader import damage

    lost = [f"device dump {w}" for w in damage(dw)] + [f"bench dump {w}" for w in damage(bw)]
    if lost and not allow_partial:
        raise DumpError(f"{lost[0]}" + (f" (and {len(lost) - 1} more problem(s))" if len(lost) > 1 else "")
                        + "; pass --allow-partial (allow_partial=True) to compare what was read")
    info: dict[str, Any] = {"step": step, "rank": rank, "device_records": int(d["record_id"].nunique()),
                            "bench_records": int(b["record_id"].nunique()), "damaged": lost}
    if not len(d) or not len(b):
        side = "device" if not len(d) else "bench"
        raise DumpError(f"the {side} dump has no records for step{step}/rank{rank}"
                        + (f": {(dw if side == 'device' else bw)[-1]}" if (dw if side == "device" else bw) else ""))
    if compiled.is_compiled(dr.header(step, rank)) or compiled.is_compiled(br.header(step, rank)):
        # a torch.compile capture: by module, phase and source op; its records' inputs from their producers
        occ = [compiled.occurrences(read_unit(r.unit(step, rank), [], compact=False)) if compiled.is_compiled(r.header(step, rank))
               else {} for r in (dr, br)]
        pairs = compiled.match_compiled(d, b, mapping, occ[0], occ[1])
        # which side is compiled, by the headers (both: the rows tell; a compiled dump has eager records too)
        one = compiled.is_compiled(dr.header(step, rank)) != compiled.is_compiled(br.header(step, rank))
        dev_c = compiled.is_compiled(dr.header(step, rank)) if one else None
        reads_inputs = compiled.reads_graph_inputs(d, b, pairs, dev_c)
        d, b = compiled.add_inputs(d, b, pairs, dev_c)
        info["compiled"] = True
    else:
        pairs = matching.match_records(d, b, mapping)
        reads_inputs = set()
    _check_same_computation(pairs, step, rank)
    _check_same_modules(pairs, d, b, step, rank, mapping)
    both = matching.pair_rows(d, b, pairs)
    _check_same_shapes(both, step, rank)
    rows = _build_rows(both, step, rank)
    stacks = dr.stacks(step, rank, warnings)
    _add_tensor_metrics(rows, both, warnings, allow_partial)
    loss_scale.normalise(rows, both, warnings)  # GradScaler: scaled gradients compared divided by S
    # a GradScaler's scaled backward overflowed, by design: that backward is not judged
    skipping, inferred = scaler_skips.skipping_sides(both)
    if skipping or inferred:
        warnings.append(scaler_skips.skip_line(step, rank, skipping, inferred))
        info["scaler_skipped"] = skipping or ["device"]
    rows["judge_dtype"] = rootcause.judge_dtypes(rows, tolerance_dtype, both.get("d_compute_dtype"),
                                                 both.get("b_compute_dtype"))  # modules that computed below fp32
    rows["floor"] = rootcause.floors(rows)
    # an earlier step trained on both sides: parameters and optimizer state carry its updates
    carried = any(s < step for s in dr.steps) and any(s < step for s in br.steps)
    unjudged = reads_inputs if info.get("compiled") and carried else None
    if info.get("compiled"):  # a gradient accumulation one side only recorded: its .grad input is untraced
        lone = compiled.unpaired_accumulations(d, pairs)
        if lone:
            unjudged = (unjudged or set()) | lone
    if skipping or inferred:
        unjudged = (unjudged or set()) | scaler_skips.mark(rows)
    arrays, suspects = rootcause.analyse(rows, threshold=threshold, step=step, rank=rank, stacks=stacks,
                                         unjudged=unjudged,
                                         carried_state=carried, sources=not info.get("compiled"))
    rows["input_error"] = arrays["input_error"]
    rows["amplification"] = arrays["amplification"]
    mc = pairs["match"].value_counts().to_dict()
    across = matching.loose_pairs_across_ops(pairs, d, b)
    if across:
        shown = ", ".join(f"{a} with {c}" for a, c in list(dict.fromkeys(across))[:3])
        warnings.append(f"step{step}/rank{rank}: {len(across)} record(s) paired across different ops by shape and "
                        f"position (device {shown}): judged on their numbers; check that they are the same "
                        f"computation (match 'shape'/'align' in the reports)")
    info.update({"matches": {k: int(v) for k, v in mc.items()},
                 "root_cause": suspects[0].name if suspects else None,
                 "root_cause_index": suspects[0].index if suspects else None,
                 "suspects": len(suspects)})
    if stacks and "d_stack" in rows.columns:  # the device op's call stack (frames), for the reports
        import pandas as pd

        rows["stack"] = pd.to_numeric(rows["d_stack"], errors="coerce").map(stacks)
    rows = rows.drop(columns=["d_stack", "d_fwd"], errors="ignore").rename(columns={"d_record_id": "device_record_id"})
    return rows, suspects, warnings, info


def _mode(rows: Any) -> str:
    if rows["cosine"].notna().any():
        return "tensor"
    if rows["md5_equal"].notna().any():
        return "md5"
    return "statistics"
