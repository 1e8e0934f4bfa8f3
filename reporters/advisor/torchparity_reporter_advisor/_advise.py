"""The diagnosis: :func:`advise` turns a comparison into the advisor's text.

Sections, in order: the verdict (never "all OK" while a row is an error), where it diverged, why
the root cause is the suspect (its numbers against the dtype's epsilon), other suspects, the
errors when no root cause was named, unmatched records, what to try next (from the op's
:mod:`family <torchparity_reporter_advisor._families>`) and how to reproduce the op alone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

from ._families import GENERIC_ADVICE, family_of, op_base
from ._rows import _count, _replay_case, _root_rows, _row_label, _tensor_line, first_divergence
from ._text import _Doc, _get, _int, _where, fmt

if TYPE_CHECKING:  # pragma: no cover
    from torchparity.results import CompareResult

#: machine epsilon by dtype name: an error of a few eps is rounding, not a bug
DTYPE_EPS = {
    "float64": 2.22e-16, "float32": 1.19e-07, "tfloat32": 9.77e-04, "float16": 9.77e-04,
    "bfloat16": 7.81e-03, "float8_e4m3fn": 0.125, "float8_e5m2": 0.25,
}


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
