"""``torchparity compare --distributed`` (and under torchrun/srun): the job engine's console side."""

from __future__ import annotations

from typing import Any

import click


def run_job(ctx: click.Context, device_dump: str, bench_dump: str, output_dir: str | None, *, as_json: bool,
            plugins_file: str | None, **kw: Any) -> int:
    """Run :func:`torchparity.compare.distributed.compare_job`; the leader prints the summary, the
    per-rank table (the ranks that need a look; all of them in ``OUT/job_report.md``) and one
    warning line per gap. Returns the exit code (every worker returns the leader's)."""
    from ..compare import job_report
    from ..compare.distributed import compare_job

    if plugins_file is None:
        plugins_file = (ctx.find_root().obj or {}).get("plugins_file")
    job = compare_job(device_dump, bench_dump, output_dir, plugins=plugins_file, **kw)
    if not job.leader:
        return job.exit_code
    s = job.summary
    if as_json:
        import json

        click.echo(json.dumps({"summary": s, "reports": [str(p) for p in job.reports]}, indent=2, default=str))
    else:
        for line in job_report.headline(s):
            click.echo(line)
        for line in job_report.rank_table(s, limit=16):
            click.echo(line)
        for p in job.reports:
            click.echo(f"wrote {p}")
    for m in s["not_compared"]:
        click.echo(f"torchparity: warning: {m}", err=True)
    for w in s["warnings"][:20]:
        click.echo(f"torchparity: warning: {w}", err=True)
    if job.exit_code == 2:
        click.echo(f"torchparity: error: {s['n_shards_not_compared']} of {s['n_shards']} shard(s) NOT compared"
                   + (f", {s['n_not_compared']} tensor(s) not compared" if s.get("n_not_compared") else "")
                   + "; no divergence among the rest, but the runs are not known to agree - see the warnings above",
                   err=True)
    return job.exit_code
