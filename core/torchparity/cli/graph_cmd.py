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
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="Step to show (default: two dumps, the first step that diverged, else 0; one dump, 0).")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="Rank to show.")
@click.option("-m", "--mapping", "--layer-mapping", "mapping", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="YAML of renamed modules, 'device_name: bench_name' per line (two dumps only).")
@click.option("--match-file", "match_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Manual matches exported from graph.html ('export matches'): module pairs join the "
                   "mapping, record pairs are joined and their statistics shown (two dumps only).")
@click.option("--bands", "bands", default=None, metavar="B1,B2,..",
              help="Upper bounds of the colour bands of the precision index, 1 to 4 increasing numbers "
                   "in (0, 1) [default: 0.2,0.4,0.6,0.8].")
@click.pass_context
def graph(ctx: click.Context, dump: str, bench: str | None, output: str, step: int | None, rank: int,
          mapping: str | None, match_file: str | None, bands: str | None) -> int:
    """Rebuild the module/op hierarchy of a dump and write it as one HTML page.

    \b
    One dump:  the hierarchy (modules from modules.jsonl, ops under the module they ran
               in, forward and backward), ops with NaN/Inf marked overflow.
    Two dumps: DUMP (device) is compared with BENCH by `torchparity compare`; every node
               is coloured by the size of its error (precision index 0..1 in bands,
               the worst below it; or by verdict), nodes on one side only are grey
               (unmatched), the root cause is marked. Unmatched nodes can be matched
               by hand in the page and the matches exported for --match-file.

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
      torchparity graph dumps/npu dumps/gpu -o out --match-file matches.json

    \b
    Exit codes: 0 ok, 1 a divergence was found (two dumps), 2 bad input.
    """
    from ..errors import UsageError
    from ..graph import build_graph, compare_graphs, write_html, write_json
    from ..graph.colours import check_bands
    from ..graph.matches import load_matches

    if bench is None:
        for opt, val in (("--mapping", mapping), ("--match-file", match_file), ("--bands", bands)):
            if val is not None:
                raise UsageError(f"{opt} needs two dumps (DUMP BENCH); a single dump is not compared")
    band_list = None
    if bands is not None:
        try:
            band_list = check_bands([b.strip() for b in bands.split(",")])
        except ValueError as exc:
            raise UsageError(f"--bands {bands!r}: {exc}") from None
    layer_map = _load_mapping(mapping)
    matches = load_matches(match_file) if match_file is not None else None
    if matches is not None:
        layer_map = {**layer_map, **matches.modules}
    from ..dump.reader import open_dump

    for d in (dump, bench):  # missing or wrong input dirs: one line, before anything is created
        if d is not None:
            open_dump(d)
    out = _output_dir(output)  # before the (long) compare: a bad -o fails fast
    if step is None:
        step = 0
        if bench is not None:  # show where it went wrong: the first step that diverged
            from ..compare.api import compare

            first = compare(dump, bench, rank=rank, layer_mapping=layer_map or None, plugins=registry_from(ctx),
                            formats=[]).summary.get("first_divergence") or {}
            step = int(first.get("step", 0) or 0)
    if bench is None:
        g = build_graph(dump, step=step, rank=rank)
    else:
        g = compare_graphs(dump, bench, step=step, rank=rank, layer_mapping=layer_map or None,
                           plugins=registry_from(ctx), matches=matches, bands=band_list)
    try:
        html = write_html(g, out / "graph.html")
        js = write_json(g, out / "graph.json")
    except OSError as exc:
        raise UsageError(f"cannot write to output directory {out}: {exc.strerror or exc}; "
                         "pass a writable -o DIR") from None
    for w in g.warnings:
        click.echo(f"torchparity: warning: {w}", err=True)
    s = g.summary
    if g.mode == "build":
        click.echo(f"graph of {dump} step {step} rank {rank}: {s['modules']} modules, {s['records']} op records, "
                   f"{s['overflow']} with NaN/Inf ({s['critical']} critical)")
    else:
        click.echo(f"graph {dump} vs {bench} step {step} rank {rank}: {s['nodes']} nodes, {s['error_nodes']} error, "
                   f"{s['unmatched_nodes']} unmatched, {s['overflow_nodes']} overflow")
        if s.get("manual_matches"):
            click.echo(f"manual matches applied: {s['manual_matches']} (statistics shown, not judged)")
        if g.root_cause:
            rc = g.nodes[g.root_cause]
            click.echo(f"root cause: {rc.name} in {rc.module or '(top level)'} [{rc.phase}]: "
                       + " > ".join(g.nodes[i].name for i in g.path_to(g.root_cause)))
    click.echo(f"wrote {html}")
    click.echo(f"wrote {js}")
    if g.mode == "compare" and s.get("diverged"):
        return EXIT_FINDINGS
    return EXIT_OK


def _load_mapping(mapping: str | None) -> dict[str, str]:
    """The layer mapping file as a dict; a file that is not text is a one-line error too."""
    from ..compare.matching import load_layer_mapping
    from ..errors import UsageError

    if mapping is None:
        return {}
    try:
        return load_layer_mapping(mapping)
    except (UnicodeDecodeError, OSError) as exc:
        why = "is not a UTF-8 text file" if isinstance(exc, UnicodeDecodeError) else f"cannot be read ({exc.strerror or exc})"
        raise UsageError(f"layer mapping {mapping} {why}; pass a YAML file of 'device_name: bench_name' lines") from None


def _output_dir(output: str) -> Path:
    """The output directory, created and checked writable (one-line error otherwise)."""
    import tempfile

    from ..errors import UsageError

    out = Path(output)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".torchparity-write-test-"):
            pass
    except OSError as exc:
        what = "is not a directory" if out.exists() and not out.is_dir() else f"cannot be written ({exc.strerror or exc})"
        raise UsageError(f"output directory {out} {what}; pass a writable -o DIR") from None
    return out
