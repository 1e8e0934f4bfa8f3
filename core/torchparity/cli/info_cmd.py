"""``torchparity info DUMP``: what a dump holds, and whether any of it was lost."""

from __future__ import annotations

import json
from typing import Any

import click

from . import EXIT_OK


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
            "lost": lost, "warnings": [w for w in warnings if w not in lost],
        })
    return {"path": str(reader.path), "format": reader.format, "steps": reader.steps,
            "units": units, "warnings": list(reader.warnings)}


@click.command("info")
@click.argument("dump", type=click.Path(exists=False))
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def info(dump: str, as_json: bool) -> None:
    """Describe DUMP (a torchparity or msprobe dump): steps, ranks, records, device, and
    whether anything was lost (a killed run, a truncated or corrupt file).

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
    for u in d["units"]:
        state = {True: "complete", False: f"INCOMPLETE ({u['incomplete_because']})", None: ""}[u["complete"]]
        dev = f"{u['device']}{' [EMULATED]' if u['emulated'] else ''}" if u["device"] else ""
        lvl = f"{u['level']}/{u['mode']}" if u["level"] else ""
        click.echo(f"  step {u['step']} rank {u['rank']}: {u['records']} records, {u['tensors']} tensor entries"
                   f"  {lvl}  {dev}  {state}".rstrip())
        for w in u["lost"]:
            click.echo(f"    lost: {w}")
        for w in u["warnings"]:
            click.echo(f"    note: {w}")
    for w in d["warnings"]:
        click.echo(f"  note: {w}")
    raise SystemExit(EXIT_OK)
