"""``torchparity compact DIR``: write the Parquet summaries of a dump written without them."""

from __future__ import annotations

import click

from . import EXIT_OK


@click.command("compact")
@click.argument("dump", type=click.Path(exists=False))
@click.option("--force", is_flag=True, help="Rewrite summaries that are already up to date.")
@click.option("-j", "--workers", type=click.IntRange(min=1), default=None,
              help="Processes writing step/ranks side by side (default: one per core, at most 8, when the "
                   "records to summarize pass 64 MB; else 1).")
def compact(dump: str, force: bool, workers: int | None) -> None:
    """Write DUMP's columnar summaries (DUMP/summary/{ops,tensors,modules}/step=S/rank=R/part.parquet)
    for every step and rank that lacks a current one. `torchparity query` writes missing ones
    itself; compact does it ahead of time (in parallel for a big job, and for step/ranks whose
    process was killed), so that every later query and compare reads them instead of parsing
    records.jsonl. Idempotent; records.jsonl is left as it is (it stays the source of truth).

    \b
    Examples:
      torchparity compact dumps/npu
      torchparity query dumps/npu "SELECT count(*) FROM ops"
    """
    from ..dump.compact import compact as run_compact

    rep = run_compact(dump, force=force, workers=workers)
    rate = f", {rep.records / rep.seconds:,.0f} records/s" if rep.records and rep.seconds > 0 else ""
    click.echo(f"{rep.path}: summaries written for {len(rep.written)} step/rank(s) ({rep.records} records, "
               f"{rep.seconds:.2f} s{rate}), {len(rep.up_to_date)} already up to date")
    for w in rep.skipped:
        click.echo(f"  skipped: {w}")
    for w in rep.failed:
        click.echo(f"  not summarized (records.jsonl serves alone): {w}")
    for w in rep.removed:
        click.echo(f"  removed the summary of a step/rank the dump no longer holds: {w}")
    raise SystemExit(EXIT_OK)
