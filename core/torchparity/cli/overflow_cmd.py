"""``torchparity overflow DUMP``: the first op that produced a harmful NaN/Inf, per rank and step.

Works on one dump, no benchmark and no device needed. Uses the ``overflow`` checker plugin
(``torchparity-checker-overflow``) on :func:`torchparity.load_dump`'s table. The rule is the
online tracker's (:mod:`torchparity.naninf_rule`): every creation site of a step is listed, the
harmful ones (their NaN/Inf reached a gradient, a parameter, optimizer state, the loss or the
model's output) on top with module path and call stack, the absorbed ones (a mask's ``-inf``,
``log(0)`` clamped away) as information. Steps that GradScaler skipped are listed, not blamed.
The same is written to ``OUT/overflow.json``.

Exit codes: 0 no harmful NaN/Inf, 1 one was found, 2 bad input.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from . import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, registry_from
from .validate import INDEX, output_dir as writable_dir


def _jsonable(x: Any) -> Any:
    """Strict-JSON value: numpy scalars unwrapped, NaN/Inf as the dump format's strings."""
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


def _rank_dirs(dump: Path) -> dict[tuple[int, int], Path]:
    out: dict[tuple[int, int], Path] = {}
    for header in dump.glob("step*/rank*/header.json"):
        try:
            step = int(header.parent.parent.name[4:])
            rank = int(header.parent.name[4:])
        except ValueError:
            continue
        out[(step, rank)] = header.parent
    return out


def _headers(dirs: dict[tuple[int, int], Path]) -> dict[tuple[int, int], dict[str, Any]]:
    headers = {}
    for key, d in dirs.items():
        try:
            headers[key] = json.loads((d / "header.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return headers


def _stacks(d: Path | None) -> dict[int, list[str]]:
    stacks: dict[int, list[str]] = {}
    if d is None or not (d / "stacks.jsonl").is_file():
        return stacks
    with open(d / "stacks.jsonl", encoding="utf-8") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
                stacks[int(obj["id"])] = list(obj.get("frames") or [])
            except (ValueError, KeyError, TypeError):
                continue  # a truncated last line
    return stacks


def _stack_frames(value: Any, stacks: dict[int, list[str]]) -> list[str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [value]
    try:
        return stacks.get(int(value), [])
    except (TypeError, ValueError):
        return []


def saturation_dtypes(headers: dict[tuple[int, int], dict[str, Any]]) -> list[str]:
    """float32 (and wider) count as saturating when a header says the device ran in saturation
    mode (Ascend with INF_NAN mode off): overflow there gives the dtype's max, not Inf."""
    for h in headers.values():
        backend = h.get("backend") or {}
        mode = backend.get("overflow_mode") or (backend.get("numerics") or {}).get("overflow_mode")
        if mode == "saturation":
            return ["float32"]
    return []


def analyse(dump: str | Path, step: int | None = None, rank: int | None = None, checker: Any = None) -> dict[str, Any]:
    """Run the overflow analysis on a dump directory; return the report as a JSON-able dict."""
    import pandas as pd

    from .. import load_dump
    from ..errors import DumpError, UsageError
    from ..naninf_rule import ABSORBED, ENTERED, HARMFUL, site_order
    from ..plugin_types import CheckContext

    path = Path(dump)
    if not path.exists():
        raise UsageError(f"dump {path} does not exist; pass the directory written by torchparity run / torchparity.dump")
    if checker is None:
        raise UsageError("no overflow checker given")
    # only the selected units are read: an open step of a running dump (no footer yet) that
    # was not asked for must not be read, nor warned about as damaged
    frame = load_dump(path, step=step, rank=rank, log_warnings=False)  # the report lists them
    if not isinstance(frame, pd.DataFrame):
        raise DumpError(f"could not read {path} as a dump")
    from ..dump.damage import damage

    warnings = list(dict.fromkeys(frame.attrs.get("warnings", []) or []))
    lost = [str(w) for w in damage(warnings)]  # truncated files, lost step directories (the reader's)
    if step is not None:
        frame = frame[frame["step"] == step]
    if rank is not None:
        frame = frame[frame["rank"] == rank]
    dirs = _rank_dirs(path) if path.is_dir() else {}
    headers = _headers(dirs)
    sat = saturation_dtypes(headers)
    ctx = CheckContext(mode="statistics", extra={"saturation_dtypes": sat})
    result = checker.scan_dump(frame, ctx)
    stack_cache: dict[tuple[int, int], dict[int, list[str]]] = {}

    def frames_for(row: Any) -> list[str]:
        key = (int(row["step"]), int(row["rank"]))
        if key not in stack_cache:
            stack_cache[key] = _stacks(dirs.get(key))
        return _stack_frames(row["stack"], stack_cache[key])

    counts = {lvl: int((result["level"] == lvl).sum()) for lvl in ("critical", "high", "medium")}

    def described(row: Any, with_stack: bool) -> dict[str, Any]:
        d = {"step": int(row["step"]), "rank": int(row["rank"]), "record_id": int(row["record_id"]),
             "name": row["name"], "op": row["op"], "module": row["module"] or "", "phase": row["phase"],
             "site": row["site"], "reason": row["reason"]}
        if with_stack:
            d["stack"] = frames_for(row)
        return d

    site_col = result["site"] if "site" in result.columns else pd.Series(None, index=result.index, dtype=object)
    # a finding: a harmful creation site still judged critical (not a GradScaler-skipped step), or
    # else a NaN/Inf that entered the step from outside and reached a sink
    finding = ((site_col == HARMFUL) & (result["level"] == "critical")) | ((site_col == ENTERED) & result["level"].notna())
    if "site" not in result.columns:  # a checker without lineage: its critical ops
        finding = result["level"] == "critical"
    first: list[dict[str, Any]] = []
    hits = result[finding].copy()
    if not hits.empty:
        hits["_order"] = [site_order(str(x), int(r)) for x, r in zip(hits["site"] if "site" in hits else [HARMFUL] * len(hits),
                                                                       hits["record_id"])]
        hits = hits.sort_values(["step", "rank", "_order"], kind="stable")
        for _, row in hits.groupby(["step", "rank"], sort=True).head(1).iterrows():
            first.append(described(row, True))
    sites: list[dict[str, Any]] = []
    listed = result[site_col.notna()].copy()
    if not listed.empty:
        listed["_order"] = [site_order(str(x) if f else ABSORBED, int(r))
                            for x, f, r in zip(listed["site"], finding[listed.index], listed["record_id"])]
        for _, row in listed.sort_values(["step", "rank", "_order"], kind="stable").iterrows():
            d = described(row, False)
            d["finding"] = bool(finding[row.name])
            sites.append(d)
    skipped = result[result["amp_skipped"].astype(bool)]
    amp = sorted({(int(s), int(r)) for s, r in zip(skipped["step"], skipped["rank"])})
    per_step = []
    for (s, r), grp in result.groupby(["step", "rank"], sort=True):
        per_step.append({"step": int(s), "rank": int(r),
                         **{lvl: int((grp["level"] == lvl).sum()) for lvl in ("critical", "high", "medium")}})
    return _jsonable({
        "dump": str(path), "step": step, "rank": rank, "saturation_dtypes": sat,
        "records": int(len(result)), "counts": counts, "first_critical": first, "sites": sites,
        "gradscaler_skipped": [{"step": s, "rank": r, "reason": "skipped by GradScaler (found_inf); not blamed on an op"} for s, r in amp],
        "per_step": per_step, "warnings": [str(w) for w in warnings],
        # a damaged dump (truncated, killed run): what was read is scanned, the rest is not known
        "damaged": lost, "complete": not lost,
    })


#: stack frames printed per critical op (overflow.json has all of them)
STACK_LINES = 6
#: creation sites printed (overflow.json lists all)
SITE_LINES = 20


@click.command("overflow")
@click.argument("dump", type=click.Path(file_okay=True, dir_okay=True))
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), default="out", show_default=True,
              callback=writable_dir,
              help="Directory for overflow.json.")
@click.option("--step", type=INDEX, default=None, help="Only this step.")
@click.option("--rank", type=INDEX, default=None, help="Only this rank.")
@click.pass_context
def overflow(ctx: click.Context, dump: str, output: str, step: int | None, rank: int | None) -> int:
    """Find the op that created a harmful NaN/Inf (or fp16/bf16 saturation), per rank and step.

    \b
    Levels: critical = finite inputs, non-finite output (the culprit);
            high     = non-finite in and out, or output norm exploding;
            medium   = non-finite inputs, finite output.
    Every creation site is listed: harmful (its NaN/Inf reached a gradient, a
    parameter, optimizer state, the loss or the model's output) first, absorbed
    ones (a mask's -inf, log(0) clamped away) as information, never a finding.
    Steps that GradScaler skipped (found_inf) are reported, not blamed.
    Values written on purpose (masked_fill(mask, -inf), finfo.min masks) are not overflow.
    Exit code 1 when a harmful NaN/Inf is found, 0 when clean, 2 on bad input
    (also a damaged dump whose readable part is clean: the rest is not known).

    \b
    Example (a statistics dump is enough; no benchmark needed):
      torchparity run -o dumps/npu --level aten -- python train.py
      torchparity overflow dumps/npu -o out      # prints the culprit, writes out/overflow.json
    """
    reg = registry_from(ctx)
    checker = reg.get("checker", "overflow")
    report = analyse(dump, step=step, rank=rank, checker=checker)
    out_dir = Path(output)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / "overflow.json"
    out_file.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")

    from rich.console import Console
    from rich.markup import escape

    console = Console(width=max(120, Console().width))
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
    c = report["counts"]
    if report["first_critical"]:
        console.print(f"[bold]First harmful NaN/Inf per step and rank[/] ({report['dump']}):")
    for f in report["first_critical"]:
        what = "critical" if f.get("site") != "entered" else "entered"
        console.print(f"[red]{what}[/] step {f['step']} rank {f['rank']}: [bold]{f['name']}[/] ({f['op']}) "
                      f"in module [bold]{escape(f['module'] or '(top level)')}[/] {escape('[' + f['phase'] + ']')}", highlight=False)
        console.print(f"    {escape(f['reason'])}", highlight=False)
        if f["stack"]:
            console.print("    stack (innermost first):", highlight=False)
            for frame in f["stack"][:STACK_LINES]:
                console.print(f"      {escape(frame)}", highlight=False, soft_wrap=True)
        else:
            console.print("    (no stack recorded: dump with stack=True)", highlight=False)
    if report["sites"]:
        console.print(f"Creation sites of NaN/Inf ({len(report['sites'])}; harmful first):")
    for site in report["sites"][:SITE_LINES]:
        tag = ("[yellow]entered[/] " if site["site"] == "entered" else
               "[red]harmful[/] " if site["finding"] else "info    ")
        where = site["module"] or "(top level)"
        console.print(f"  {tag} step {site['step']} rank {site['rank']}: {site['name']} ({site['op']}) in "
                      f"{escape(where)} {escape('[' + site['phase'] + ']')}"
                      + ("" if site["finding"] or site["site"] != "absorbed" else ": absorbed (information)"),
                      highlight=False)
    if len(report["sites"]) > SITE_LINES:
        console.print(f"  ... {len(report['sites']) - SITE_LINES} more in {out_file}", highlight=False)
    for s in report["gradscaler_skipped"]:
        console.print(f"step {s['step']} rank {s['rank']}: {s['reason']}")
    console.print(f"{report['records']} op records: {c['critical']} critical, {c['high']} high, {c['medium']} medium. "
                  f"Report: {out_file}")
    if report["first_critical"]:
        return EXIT_FINDINGS
    if report["damaged"]:
        console.print(f"[yellow]no harmful NaN/Inf in the {report['records']} records that could be read, but part of "
                      f"the dump is lost (see the warnings above): it is not known to be clean[/] - re-dump, or "
                      f"scan the steps that are whole with --step", highlight=False)
        return EXIT_USAGE
    console.print("[green]no harmful NaN/Inf found[/]")
    return EXIT_OK
