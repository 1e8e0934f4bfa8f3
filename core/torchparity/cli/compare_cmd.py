"""``torchparity compare``: name the op where two runs start to diverge."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import click

from . import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, registry_from
from .validate import INDEX, WORKERS, amplification, output_dir as writable_dir


@click.command("compare")
@click.argument("device_dump", type=click.Path())
@click.argument("bench_dump", type=click.Path())
@click.option("-o", "--output", "output_dir", type=click.Path(file_okay=False), default=None, callback=writable_dir,
              help="Directory for the reports (created). Default: no files, console summary only.")
@click.option("--step", type=INDEX, default=None, help="Compare only this step (default: every step in both dumps).")
@click.option("--rank", type=INDEX, default=None, help="Compare only this rank (default: every rank in both dumps).")
@click.option("-f", "--format", "formats", default=None, metavar="LIST",
              help="Reporters to run, comma-separated, e.g. log,xlsx,json,advisor "
                   "(default: every enabled reporter when -o is given).")
@click.option("-m", "--mapping", "--layer-mapping", "layer_mapping", type=click.Path(dir_okay=False), default=None,
              metavar="FILE",
              help="YAML of renamed modules, 'device_name: bench_name' per line (e.g. linear_qkv: query_key_value).")
@click.option("--plugins", "plugins_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="plugins.yaml choosing checkers/reporters and their options (per-op/per-dtype tolerances); "
                   "same as `torchparity --plugins FILE compare ...`.")
@click.option("--threshold", type=float, default=10.0, show_default=True, callback=amplification,
              help="Amplification (output error / input error) at which an op becomes a suspect.")
@click.option("--tolerance-dtype", default=None, metavar="DTYPE",
              help="Judge noise as if the device computed in DTYPE (e.g. bfloat16 for an emulated run "
                   "stored as float32). Default: the lower precision dtype of each pair.")
@click.option("-j", "--workers", type=WORKERS, default=None,
              help="Worker processes for multi-step/multi-rank dumps (default: automatic).")
@click.option("--allow-partial", is_flag=True,
              help="Compare what can be read of a truncated or corrupt dump (a killed run) instead of "
                   "stopping with exit code 2.")
@click.option("--replay", type=click.IntRange(min=0), default=20, show_default=True, metavar="N",
              help="Tensor mode: replay up to N suspect ops alone on their recorded device inputs in float64 "
                   "to confirm or clear them (0: off).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and root cause as JSON on stdout.")
@click.option("--distributed", is_flag=True,
              help="Compare shard by shard ((step, rank) pairs, -j workers in a local pool) and write one job "
                   "report: the first diverging (step, rank, op) and a per-rank table. Automatic under torchrun "
                   "or srun (one worker per process). See docs/distributed-compare.md.")
@click.pass_context
def compare(ctx: click.Context, device_dump: str, bench_dump: str, output_dir: str | None, step: int | None,
            rank: int | None, formats: str | None, layer_mapping: str | None, plugins_file: str | None, threshold: float,
            tolerance_dtype: str | None, workers: int | None, allow_partial: bool, replay: int, as_json: bool,
            distributed: bool) -> int:
    """Compare DEVICE_DUMP with BENCH_DUMP and name the op where they start to diverge.

    \b
    Both arguments are dump directories written by `torchparity run -o DIR` or
    torchparity.dump(DIR) (the root, a stepN or a stepN/rankN directory); msprobe dumps
    (dump.json + dump_tensor_data) are read too. Statistics, md5 and tensor dumps all work.

    \b
    What it does:
      1. pairs device and bench ops even when the sequences differ (extra or fused ops,
         different call counts, renamed modules with --layer-mapping);
      2. measures every tensor in float64 (statistics: max/min/mean/norm differences;
         tensors: cosine, max abs/rel error, RMSE, 1/1000 and 5/1000 ratios...);
      3. gives each tensor pass/warning/error with dtype-aware tolerances (a bf16 run is
         judged against bf16 rounding, not flagged wholesale);
      4. scores every op by amplification: its output error over its input error. The
         root cause is the earliest op that introduced a divergence instead of carrying it.

    \b
    Examples:
      torchparity compare dumps/npu dumps/cpu -o out
      torchparity compare dumps/npu dumps/cpu --step 3 --rank 0 --format log,json -o out
      torchparity compare msprobe_dump/step0 golden/step0 --mapping mapping.yaml
      torchparity compare dumps/npu dumps/cpu --plugins my_tolerances.yaml -o out

    \b
    Exit codes: 0 the runs agree, 1 a divergence was found, 2 bad input (missing,
    truncated or mismatched dumps, or tensors that could not be compared; the message
    says what was read and what to do).
    """
    from ..compare.api import compare as run_compare
    from ..compare.distributed import launched

    if distributed or launched():  # the job engine: compare/distributed.py
        from .compare_job import run_job

        return run_job(ctx, device_dump, bench_dump, output_dir, step=step, rank=rank, formats=formats,
                       layer_mapping=layer_mapping, plugins_file=plugins_file, threshold=threshold,
                       tolerance_dtype=tolerance_dtype, workers=workers, allow_partial=allow_partial, replay=replay,
                       as_json=as_json)
    if plugins_file is not None:
        from ..plugins import get_registry

        reg = get_registry(plugins_file)
    else:
        reg = registry_from(ctx)
    with _console_on_stderr(reg, as_json):  # --json: stdout holds the JSON alone
        res = run_compare(device_dump, bench_dump, output_dir=output_dir, step=step, rank=rank, formats=formats,
                          layer_mapping=layer_mapping, plugins=reg, threshold=threshold,
                          tolerance_dtype=tolerance_dtype, workers=workers, allow_partial=allow_partial,
                          replay=replay)
    s = res.summary
    if as_json:
        import json

        payload = {"summary": s, "root_cause": res.root_cause.to_dict() if res.root_cause else None,
                   "suspects": [x.to_dict() for x in res.suspects[:10]],
                   "reports": {k: [str(p) for p in v] for k, v in res.reports.items()}}
        click.echo(json.dumps(payload, indent=2, default=str))
    elif "log" not in res.reports:  # the log reporter already printed the console summary
        _print_summary(res)
    for w in s.get("warnings", []):
        click.echo(f"torchparity: warning: {w}", err=True)
    if res.diverged:
        return EXIT_FINDINGS
    if not s.get("complete", True):
        click.echo(f"torchparity: error: {_incomplete(s)}", err=True)
        return EXIT_USAGE
    return EXIT_OK


@contextlib.contextmanager
def _console_on_stderr(reg: Any, on: bool) -> Iterator[None]:
    """With ``on``, the console reporter ('log') prints to stderr for the block (then as before)."""
    log = reg.reporters.get("log") if on else None
    opts = getattr(log, "options", None)
    if opts is None or not dataclasses.is_dataclass(opts) or getattr(opts, "stream", "stderr") == "stderr":
        yield
        return
    log.options = dataclasses.replace(opts, stream="stderr")
    try:
        yield
    finally:
        log.options = opts


def _incomplete(s: dict[str, Any]) -> str:
    """One line: why a comparison without divergence is still not "the runs agree"."""
    parts = []
    if s.get("n_not_compared"):
        parts.append(f"{s['n_not_compared']} paired tensor(s) could not be compared")
    if s.get("n_damaged"):
        parts.append(f"{s['n_damaged']} damaged part(s) of the dumps were skipped (--allow-partial)")
    scaler = any(p.get("scaler_skipped") for p in s.get("pairs", []))
    fix = ("compare a step the GradScaler did not skip" if scaler and not s.get("n_damaged")
           else "re-dump the damaged side")
    return ("no divergence among what was compared, but " + " and ".join(parts)
            + f"; the runs are not known to agree - see the warnings above and {fix}")


def _print_summary(res: object) -> None:
    s = res.summary  # type: ignore[attr-defined]
    rc = res.root_cause  # type: ignore[attr-defined]
    click.echo(f"compared {s['n_compared']} tensors ({s['mode']} mode) over step(s) {s['steps']} rank(s) {s['ranks']}: "
               f"{s['n_pass']} pass, {s['n_warning']} warning, {s['n_error']} error, "
               + "".join(f"{s[k]} {label}, " for k, label in (("n_not_compared", "NOT compared"),
                                                                 ("n_unchecked", "unchecked")) if s.get(k)) +
               f"{s['n_unmatched_device']} device-only, {s['n_unmatched_bench']} bench-only rows "
               f"({s['elapsed_s']:.2f} s)")
    if rc is None:
        if s["n_error"]:
            click.echo("no op introduced a divergence (but some rows are errors, see the report)")
        elif not s.get("complete", True):
            click.echo("no op introduced a divergence among the compared tensors; some could not be compared")
        elif s.get("n_unchecked"):
            click.echo(f"no op introduced a divergence; {s['n_unchecked']} row(s) differ beyond rounding and no "
                       f"checker judged them")
        else:
            click.echo("no op introduced a divergence: the runs agree")
    else:
        where = f"{rc.module}" if rc.module else "(top level)"
        click.echo(f"root cause: {rc.name} [{rc.op}] in {where}, {rc.phase}, step {rc.step} rank {rc.rank}, op #{rc.index}")
        click.echo(f"  {rc.reason}")
        if rc.stack:
            click.echo(f"  at {rc.stack[-1]}")
        others = [x for x in res.suspects[1:6]]  # type: ignore[attr-defined]
        if others:
            click.echo("other suspects: " + "; ".join(f"{x.name} (x{x.score:.3g})" for x in others))
    for r in [r for p in s.get("pairs", []) for r in p.get("replay", []) if r["verdict"] == "cleared"][:5]:
        click.echo(f"cleared by replay: {r['name']}: {r['reason']}")
    for name, paths in res.reports.items():  # type: ignore[attr-defined]
        for p in paths:
            click.echo(f"wrote {p}")
