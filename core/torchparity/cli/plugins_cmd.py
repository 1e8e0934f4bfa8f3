"""``torchparity plugins``: what is installed, enabled and usable here."""

from __future__ import annotations

import json

import click

from . import EXIT_OK, registry_from


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.option("--no-probe", is_flag=True, help="Do not probe backends for availability (faster, no torch import).")
@click.pass_context
def plugins(ctx: click.Context, as_json: bool, no_probe: bool) -> int:
    """List plugins: kind, name, version, enabled, and whether each backend is available (and why not).

    Problems found while loading plugins (a plugin that fails to import, two plugins claiming the
    same name, an unknown name in plugins.yaml) are printed as warnings; the rest keeps working.
    """
    reg = registry_from(ctx)
    rows = []
    for c in reg.components:
        available, why = "", ""
        if c.kind == "backend" and not no_probe:
            a = c.component.is_available()
            available, why = ("yes" if a else "no"), a.reason
        rows.append(
            {
                "kind": c.kind,
                "name": c.name,
                "plugin": c.plugin,
                "version": c.version or "",
                "enabled": c.enabled,
                "available": available,
                "detail": why or c.why_disabled or getattr(c.component, "description", ""),
            }
        )
    broken = [
        {"kind": "plugin", "name": p.name, "plugin": p.name, "version": p.version or "", "enabled": False,
         "available": "", "detail": f"{p.status}: {p.detail}"}
        for p in reg.plugins
        if p.status != "loaded"
    ]
    rows += broken
    if as_json:
        click.echo(json.dumps({"plugins": rows, "problems": reg.problems, "config": str(reg.config.path)}, indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"torchparity plugins (config: {reg.config.path or 'built-in defaults'})")
    for col in ("kind", "name", "version", "enabled", "available", "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["kind"], r["name"], r["version"], "yes" if r["enabled"] else "no", r["available"], r["detail"]
        )
    console = Console(width=max(100, Console().width))
    console.print(table)
    return EXIT_OK
