"""``torchparity grads RUN_A RUN_B -o OUT``: the first step and parameter whose gradient direction drifts."""

from __future__ import annotations

import click

from . import EXIT_FINDINGS, EXIT_OK, registry_from


@click.command("grads")
@click.argument("run_a", type=click.Path())
@click.argument("run_b", type=click.Path())
@click.option("-o", "--output", "output_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for grad_compare.json (created). Default: console only.")
@click.option("--rank", type=int, default=None, help="Compare only this rank (default: every rank in both runs).")
@click.option("--top", type=int, default=5, show_default=True, help="Drifted parameters listed for the first drift step.")
@click.pass_context
def grads(ctx: click.Context, run_a: str, run_b: str, output_dir: str | None, rank: int | None, top: int) -> int:
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

    \b
    Exit codes: 0 no drift, 1 a drift was found, 2 bad input (not a gradient run,
    different sketch settings, no step in common).
    """
    from ..gradients.compare import compare_runs

    res = compare_runs(run_a, run_b, output_dir=output_dir, rank=rank, plugins=registry_from(ctx))
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
    for p in res.files:
        click.echo(f"wrote {p}")
    return EXIT_FINDINGS if res.diverged else EXIT_OK
