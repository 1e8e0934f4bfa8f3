"""``torchparity graph DUMP [BENCH] -o OUT``: the model's module/op hierarchy as a browsable page."""

from __future__ import annotations

from pathlib import Path

import click

from . import EXIT_FINDINGS, EXIT_OK, registry_from


@click.command("graph")
@click.argument("dump", type=click.Path())
@click.argument("bench", type=click.Path(), required=False)
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), required=True,
              help="Directory for graph.html and graph.json (created).")
@click.option("--step", type=int, default=None,
              help="Step to show (default: two dumps, the first step that diverged, else 0; one dump, 0).")
@click.option("--rank", type=int, default=0, show_default=True, help="Rank to show.")
@click.option("-m", "--mapping", "--layer-mapping", "mapping", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="YAML of renamed modules, 'device_name: bench_name' per line (two dumps only).")
@click.pass_context
def graph(ctx: click.Context, dump: str, bench: str | None, output: str, step: int | None, rank: int,
          mapping: str | None) -> int:
    """Rebuild the module/op hierarchy of a dump and write it as one HTML page.

    \b
    One dump:  the hierarchy (modules from modules.jsonl, ops under the module they ran
               in, forward and backward), ops with NaN/Inf marked overflow.
    Two dumps: DUMP (device) is compared with BENCH by `torchparity compare`; every node
               is coloured by its worst verdict below it (pass/warning/error/overflow),
               nodes on one side only are grey (unmatched), the root cause is marked.

    \b
    OUT/graph.html is self-contained (no network): open it in any browser. It has a
    collapsible tree, a search box, filters (errors, warnings+errors, overflow,
    unmatched, phase), a "go to root cause" button and a details pane (op, module,
    phase, dtype/shape, statistics of both sides, metrics, stack). OUT/graph.json holds
    the same data as strict JSON. Dump with level module, mix or api to get modules.

    \b
    Examples:
      torchparity graph dumps/npu dumps/cpu -o out      # compare, open out/graph.html
      torchparity graph dumps/npu -o out --step 1       # one model's hierarchy
      torchparity graph dumps/npu dumps/gpu -o out --mapping map.yaml

    \b
    Exit codes: 0 ok, 1 a divergence was found (two dumps), 2 bad input.
    """
    from ..errors import UsageError
    from ..graph import build_graph, compare_graphs, write_html, write_json

    if bench is None and mapping is not None:
        raise UsageError("--mapping needs two dumps (DUMP BENCH); a single dump is not compared")
    if step is None:
        step = 0
        if bench is not None:  # show where it went wrong: the first step that diverged
            from ..compare.api import compare

            first = compare(dump, bench, rank=rank, layer_mapping=mapping, plugins=registry_from(ctx),
                            formats=[]).summary.get("first_divergence") or {}
            step = int(first.get("step", 0) or 0)
    if bench is None:
        g = build_graph(dump, step=step, rank=rank)
    else:
        g = compare_graphs(dump, bench, step=step, rank=rank, layer_mapping=mapping, plugins=registry_from(ctx))
    out = Path(output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {out}: {exc.strerror or exc}") from None
    html = write_html(g, out / "graph.html")
    js = write_json(g, out / "graph.json")
    for w in g.warnings:
        click.echo(f"torchparity: warning: {w}", err=True)
    s = g.summary
    if g.mode == "build":
        click.echo(f"graph of {dump} step {step} rank {rank}: {s['modules']} modules, {s['records']} op records, "
                   f"{s['overflow']} with NaN/Inf ({s['critical']} critical)")
    else:
        click.echo(f"graph {dump} vs {bench} step {step} rank {rank}: {s['nodes']} nodes, {s['error_nodes']} error, "
                   f"{s['unmatched_nodes']} unmatched, {s['overflow_nodes']} overflow")
        if g.root_cause:
            rc = g.nodes[g.root_cause]
            click.echo(f"root cause: {rc.name} in {rc.module or '(top level)'} [{rc.phase}]: "
                       + " > ".join(g.nodes[i].name for i in g.path_to(g.root_cause)))
    click.echo(f"wrote {html}")
    click.echo(f"wrote {js}")
    if g.mode == "compare" and s.get("diverged"):
        return EXIT_FINDINGS
    return EXIT_OK
