"""``torchparity query DIR SQL``: DuckDB SQL over a dump's Parquet summaries (a thin layer over
:func:`torchparity.dump.query.query`)."""

from __future__ import annotations

import math

import click

from . import EXIT_OK


def _table(df: object, limit: int) -> str:
    """A readable plain-text table of at most ``limit`` rows."""
    import pandas as pd

    assert isinstance(df, pd.DataFrame)
    if not len(df.columns):
        return "(no columns)"
    shown = df.head(limit)
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 60,
                           "display.float_format", lambda x: "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.6g}"):
        text = shown.to_string(index=False) if len(shown) else " | ".join(map(str, df.columns)) + "\n(0 rows)"
    if len(df) > limit:
        text += f"\n... {len(df) - limit} more row(s) ({len(df)} in all): raise --limit, or use --format csv"
    return text


@click.command("query")
@click.argument("dump", type=click.Path(exists=False))
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="Output: a readable table, or CSV / JSON (one object per row) for scripts.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Rows shown in table format (csv and json print every row).")
def query(dump: str, sql: str, fmt: str, limit: int) -> None:
    """Run SQL over every step and rank of DUMP without loading a tensor: DuckDB SQL over the
    views ops (one row per record), tensors (one row per argument/result, with its statistics)
    and modules (one row per module and phase), each with step and rank columns. Reads the
    dump's Parquet summaries; the first query of a dump writes them (torchparity compact DUMP
    does the same), for every step/rank that has finished.

    \b
    Examples:
      torchparity query dumps/npu "SELECT step, rank, count(*) FROM ops GROUP BY ALL ORDER BY ALL"
      torchparity query dumps/npu "SELECT min(step) FROM tensors WHERE nan > 0" --format csv
    """
    from ..dump.query import query as run_query

    df = run_query(dump, sql)
    if fmt == "csv":
        click.echo(df.to_csv(index=False), nl=False)
    elif fmt == "json":
        text = df.to_json(orient="records", lines=True, default_handler=str) if len(df) else ""
        click.echo(text if text.endswith("\n") or not text else text + "\n", nl=False)
    else:
        click.echo(_table(df, limit))
    raise SystemExit(EXIT_OK)
