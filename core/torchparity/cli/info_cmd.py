"""``torchparity info DUMP``: what a dump holds, and whether any of it was lost."""

from __future__ import annotations

import json
from typing import Any

import click

from . import EXIT_OK


def compiled_summary(header: dict[str, Any]) -> list[str]:
    """What a step's header says of torch.compile'd code, one line each: the graphs captured
    (``compile``), what of them was not captured and why, and compiled code the dump ran but could
    not see (``compiled_functions``). Empty when the step ran nothing compiled."""
    comp = header.get("compile") if isinstance(header.get("compile"), dict) else None
    lines: list[str] = []
    if comp is not None:
        graphs = comp.get("graphs") if isinstance(comp.get("graphs"), dict) else {}
        g = ", ".join(f"{n} {phase}" for phase, n in graphs.items())
        lines.append(f"torch.compile ({comp.get('inner') or '?'}), captured in graph{' (graphs: ' + g + ')' if g else ''}")
        skipped = comp.get("not_captured") if isinstance(comp.get("not_captured"), dict) else {}
        lines += [f"not captured: {n} x {why}" for why, n in skipped.items()]
        if comp.get("random_ops"):
            lines.append(f"{comp['random_ops']} random op(s) draw from Inductor's generator, not eager's "
                         f"(fallback_random={comp.get('fallback_random')})")
    note = header.get("compiled_functions")
    if isinstance(note, str) and note:
        lines.append(note)
    return lines


def describe_dump(path: str) -> dict[str, Any]:
    """Steps, ranks, record counts, completeness and device of every (step, rank) in a dump."""
    from ..dump.footer import read_footer
    from ..dump.reader import damage, open_dump, read_unit

    reader = open_dump(path)
    units = []
    for u in reader.units:
        warnings: list[str] = []
        df = read_unit(u, warnings)
        header = reader.header(u.step, u.rank) if u.format == "torchparity" else {}
        footer = reader.footer(u.step, u.rank) if u.format == "torchparity" else None
        backend = header.get("backend") if isinstance(header.get("backend"), dict) else {}
        error = footer.get("error") if footer else None
        state = read_footer(u.path, f"step{u.step}/rank{u.rank}").state if u.format == "torchparity" else None
        lost = damage(warnings)
        if state is None and lost and u.format == "torchparity":  # closed cleanly, damaged since
            state = "damaged after a clean close, see lost"
        units.append({
            "step": u.step, "rank": u.rank,
            "records": int(df["record_id"].nunique()) if len(df) else 0,
            "tensors": int(len(df)),
            "complete": (state is None) if u.format == "torchparity" else None,
            "incomplete_because": state, "writer_error": str(error) if isinstance(error, str) else None,
            "level": header.get("level"), "mode": header.get("mode"),
            "device": backend.get("device_name") or backend.get("backend"),
            "emulated": bool(backend.get("emulation")),
            "torch": backend.get("torch_version"),
            "compiled": compiled_summary(header),
            "lost": lost, "warnings": [w for w in warnings if w not in lost],
        })
    return {"path": str(reader.path), "format": reader.format, "steps": reader.steps,
            "units": units, "warnings": list(reader.warnings)}


@click.command("info")
@click.argument("dump", type=click.Path(exists=False))
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def info(dump: str, as_json: bool) -> None:
    """Describe DUMP (a torchparity or msprobe dump): steps, ranks, records, device, what of
    torch.compile'd code was not captured (and why), and whether anything was lost (a killed
    run, a truncated or corrupt file).

    \b
    Examples:
      torchparity info dumps/npu
      torchparity info dumps/npu --json
    """
    d = describe_dump(dump)
    if as_json:
        click.echo(json.dumps(d, indent=1))
        raise SystemExit(EXIT_OK)
    click.echo(f"{d['path']}  ({d['format']} dump, steps {', '.join(map(str, d['steps'])) or 'none'})")
    shown: list[str] = []
    for u in d["units"]:
        state = {True: "complete", False: f"INCOMPLETE ({u['incomplete_because']})", None: ""}[u["complete"]]
        dev = f"{u['device']}{' [EMULATED]' if u['emulated'] else ''}" if u["device"] else ""
        lvl = f"{u['level']}/{u['mode']}" if u["level"] else ""
        click.echo(f"  step {u['step']} rank {u['rank']}: {u['records']} records, {u['tensors']} tensor entries"
                   f"  {lvl}  {dev}  {state}".rstrip())
        if u["compiled"] and u["compiled"] != shown:  # said once while it stays the same
            click.echo(f"    compiled: {u['compiled'][0]}")
            for line in u["compiled"][1:]:
                click.echo(f"      {line}")
        shown = u["compiled"] or shown
        for w in u["lost"]:
            click.echo(f"    lost: {w}")
        for w in u["warnings"]:
            click.echo(f"    note: {w}")
    for w in d["warnings"]:
        click.echo(f"  note: {w}")
    raise SystemExit(EXIT_OK)
