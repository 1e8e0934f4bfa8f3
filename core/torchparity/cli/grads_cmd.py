"""``torchparity grads RUN_A RUN_B -o OUT``: the first step and parameter whose gradient direction drifts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError
from . import EXIT_FINDINGS, EXIT_OK, registry_from


class _Count(click.ParamType):
    """A whole number >= 0; a bad value is one line naming the option (exit 2), not click's usage block."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        opt = "/".join(param.opts) if param is not None else "value"
        try:
            n = int(str(value).strip())
        except ValueError:
            raise UsageError(f"grads {opt}: {value!r} is not a whole number") from None
        if n < 0:
            raise UsageError(f"grads {opt}: must be >= 0 (got {n})")
        return n


def _output_dir(path: str | None, opt: str) -> None:
    """Create ``path`` as a directory, or one line saying why it cannot be (exit 2)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"grads {opt} {p}: exists and is not a directory; pass a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"grads {opt} {p}: cannot create the directory ({exc.strerror or exc}); pass a writable one") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"grads {opt} {p}: the directory is not writable; pass a writable one")


@click.command("grads")
@click.argument("run_a", type=click.Path())
@click.argument("run_b", type=click.Path())
@click.option("-o", "--output", "output_dir", type=str, metavar="DIR", default=None,
              help="Directory for grad_compare.json (created). Default: console only.")
@click.option("--rank", type=_Count(), default=None, help="Compare only this rank (default: every rank in both runs).")
@click.option("--top", type=_Count(), default=5, show_default=True, help="Drifted parameters listed for the first drift step.")
@click.option("--plots", "plots_dir", type=str, metavar="DIR", default=None,
              help="Directory for PNG plots (created): each parameter's cosine over the steps, and "
                   "summary.png (numel-weighted mean). Needs matplotlib.")
@click.pass_context
def grads(ctx: click.Context, run_a: str, run_b: str, output_dir: str | None, rank: int | None, top: int,
          plots_dir: str | None) -> int:
    """Compare the gradients of two runs and name the first step and parameter whose gradient
    direction drifts.

    \b
    RUN_A (the device under test) and RUN_B (the benchmark) are directories written by
    torchparity.GradMonitor, which records per step and parameter the gradient's statistics
    and a direction sketch:
        with torchparity.GradMonitor(model, "grads/npu", optimizer=opt):
            ...train as usual...

    \b
    For every (rank, step, parameter) the cosine and the sign agreement of the two gradients'
    sketches are judged by the grad_direction checker (drift below cosine 0.99, warning
    below 0.999, gradients too small to have a direction are skipped; thresholds in
    plugins.yaml). The first drift is the earliest step with a drifted gradient; in it,
    a parameter whose values already differ is named, else the most drifted gradient.

    \b
    Examples:
      torchparity grads grads/npu grads/cuda
      torchparity grads grads/npu grads/cuda -o out --rank 0
      torchparity grads grads/npu grads/cuda --plots plots

    \b
    Exit codes: 0 no drift, 1 a drift was found, 2 bad input (not a gradient run,
    different sketch settings, no step in common).
    """
    from ..gradients.compare import compare_runs

    _output_dir(output_dir, "-o")
    _output_dir(plots_dir, "--plots")
    if plots_dir is not None:
        from ..gradients.plots import _figure_class

        _figure_class()  # matplotlib missing: say so before comparing
    res = compare_runs(run_a, run_b, output_dir=output_dir, rank=rank, plugins=registry_from(ctx))
    if plots_dir is not None:
        from ..gradients.plots import write_compare_plots

        res.files += write_compare_plots(res, plots_dir)
    s = res.summary
    steps = s["steps"]
    click.echo(f"compared {s['n_rows']} parameter gradients over {len(steps)} step(s) "
               f"({steps[0]}..{steps[-1]}) and rank(s) {s['ranks']}: {s['n_pass']} pass, {s['n_warning']} warning, "
               f"{s['n_error']} drift, {s['n_skip']} too small to judge")
    fd = res.first_drift
    if fd is None:
        msg = "no gradient direction drift"
        judged = res.rows[res.rows["verdict"] != "skip"]
        if len(judged):
            w = judged.sort_values(["cosine", "step"], kind="stable").iloc[0]
            msg += (f" (lowest cosine {w['cosine']:.6f}: step {int(w['step'])}, rank {int(w['rank'])}, {w['param']}"
                    + (f"; {s['n_warning']} warning(s)" if s["n_warning"] else "") + ")")
        click.echo(msg)
    else:
        what = "parameter values differ" if fd.get("kind") == "parameter" else "gradient direction drifts"
        click.echo(f"first drift: step {fd['step']}, rank {fd['rank']}, parameter {fd['param']} ({what})")
        click.echo(f"  {fd['reason']}")
        click.echo(f"  {fd['n_params_drifted']} of {fd['n_params']} parameter gradients drifted at step {fd['step']}; "
                   "most drifted first:")
        for d in res.drifted[: max(0, top)]:
            click.echo(f"    {d['param']:<48} cosine {d['cosine']:.4f}  sign agreement {d['sign_agreement']:.3f}  "
                       f"norm {d['norm_a']:.3g} vs {d['norm_b']:.3g}")
    for w in s.get("warnings", []):
        click.echo(f"torchparity: warning: {w}", err=True)
    pngs = [p for p in res.files if p.suffix == ".png"]
    for p in res.files:
        if p.suffix != ".png":
            click.echo(f"wrote {p}")
    if pngs:
        click.echo(f"wrote {len(pngs)} plots to {plots_dir}")
    return EXIT_FINDINGS if res.diverged else EXIT_OK
