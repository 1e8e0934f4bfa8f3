"""``torchparity bisect SCRIPT --entry FN --step N``: thin CLI over :func:`torchparity.bisect`."""

from __future__ import annotations

import click

from . import EXIT_FINDINGS, EXIT_OK


@click.command("bisect")
@click.argument("script", type=click.Path(dir_okay=False))
@click.option("--entry", default="main", show_default=True, metavar="FN",
              help="Function of SCRIPT to run; it returns the output to judge, or a list with one per step.")
@click.option("--step", default=0, show_default=True, type=int, help="Which step's output to judge.")
@click.option("--target", default="emulated:bfloat16", show_default=True,
              help="emulated:bfloat16, emulated:float16 (run under the emulated device), or native "
                   "(FN is called with target=True / target=False).")
@click.option("--tolerance", default=None, type=float,
              help="Relative L2 error of the step's outputs within which the divergence is removed "
                   "(default: the compare's noise floor for the dtype: bf16 0.01, fp16 0.002).")
@click.option("--promote-dtype", default="float32", show_default=True, type=click.Choice(["float32", "float64"]),
              help="Precision promoted ops compute in (native targets).")
@click.option("--promote-backend", default=None, metavar="NAME",
              help="Compute promoted ops on this backend (cpu: the reference), in their own dtypes, instead "
                   "of in a higher precision: finds a device kernel that computes wrongly rather than a "
                   "rounding problem.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every run.")
@click.option("--output", "-o", default="bisect-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for bisect-report.json.")
@click.option("--compare", "compare_dir", default=None, type=click.Path(file_okay=False),
              help="A compare output directory (compare.json): its root cause is tried first (its module, "
                   "then its op, promoted alone) and shown beside the bisect's answer.")
@click.option("--max-culprits", default=8, show_default=True, type=click.IntRange(min=1),
              help="Stop when this many modules (or ops) are found and do not yet remove the divergence: "
                   "verdict 'diffuse' (spread over many units), with those found.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def bisect(script: str, entry: str, step: int, target: str, tolerance: float | None, promote_dtype: str,
           promote_backend: str | None, seed: int, output: str, compare_dir: str | None, max_culprits: int,
           as_json: bool) -> int:
    """Prove which modules/ops cause a precision divergence by re-running them promoted.

    \b
    Example:
      torchparity bisect train.py --entry main --step 0 --target emulated:bfloat16 -o bisect-out

    Exit codes: 0 no divergence to bisect, 1 a divergence (culprit found, spread over more than
    --max-culprits units, or not a precision problem), 2 bad input.
    """
    import json

    from ..bisect import bisect as run_bisect

    rep = run_bisect(script, entry=entry, step=step, target=target, tolerance=tolerance,
                     promote_dtype=promote_dtype, seed=seed, output_dir=output, compare_dir=compare_dir,
                     max_culprits=max_culprits, promote_backend=promote_backend)
    click.echo(json.dumps(rep.to_dict(), indent=1) if as_json else rep.summary())
    return EXIT_OK if rep.verdict == "no_divergence" else EXIT_FINDINGS
