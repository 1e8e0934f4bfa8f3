"""``torchparity demo``: find a planted divergence in a small model, on the CPU."""

from __future__ import annotations

import math

import click

from typing import Any

from . import EXIT_FINDINGS, EXIT_OK
from .validate import output_dir as writable_dir


def _fault_factor(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A finite, non-zero factor other than 1 (x1 plants nothing; NaN/inf are not a small fault)."""
    if not math.isfinite(value) or value == 0 or value == 1:
        raise click.BadParameter(f"{value!r} plants no usable fault; give a finite factor other than 0 and 1, e.g. 1.05",
                                 ctx=ctx, param=param)
    return value


@click.command("demo")
@click.option("-o", "--output", "out_dir", default="torchparity-demo", show_default=True,
              type=click.Path(file_okay=False), callback=writable_dir,
              help="Where the two dumps and the reports go (replaced).")
@click.option("--steps", default=2, show_default=True, type=click.IntRange(1, 20), help="Training steps per run.")
@click.option("--level", default="aten", show_default=True, type=click.Choice(["module", "api", "aten", "mix"]),
              help="Dump level of both runs.")
@click.option("--fault-module", default="layers.1.mlp.down_proj", show_default=True,
              help="Module path whose matmul gets the planted fault.")
@click.option("--fault-step", default=1, show_default=True, type=click.IntRange(min=0),
              help="Step at which the fault fires.")
@click.option("--fault-phase", default="forward", show_default=True, type=click.Choice(["forward", "backward"]))
@click.option("--factor", default=1.05, show_default=True, type=float, callback=_fault_factor,
              help="The planted fault multiplies one matmul output by this.")
def demo(out_dir: str, steps: int, level: str, fault_module: str, fault_step: int, fault_phase: str,
         factor: float) -> None:
    """Train a small Llama-like model on the CPU reference and on the EMULATED device with one
    planted fault, compare the two dumps, and show the op torchparity blames.

    The emulated device is the CPU running with an injected fault, standing in for an
    accelerator; no hardware is needed. Exit code 0 when the planted op is found as the root
    cause, 1 when it is not.

    \b
    Examples:
      torchparity demo
      torchparity demo --fault-module layers.0.self_attn.q_proj --fault-step 0 --factor 2
      torchparity demo --fault-phase backward --level aten
    """
    from ..demo import ATEN_LEVELS, DemoFault, run_demo

    fault = DemoFault(module=fault_module, step=fault_step, phase=fault_phase, factor=factor)
    res = run_demo(out_dir, steps=steps, level=level, fault=fault, say=click.echo)
    rc = res.result.root_cause
    click.echo("")
    if rc is None:
        click.echo("torchparity found no divergence between the two runs.")
    else:
        click.echo(f"Root cause: {rc.name}  ({rc.op})")
        click.echo(f"  module:   {rc.module or '(top level)'}")
        click.echo(f"  phase:    {rc.phase}, step {rc.step}, rank {rc.rank}")
        click.echo(f"  why:      {rc.reason}")
    click.echo(f"Planted:    {fault.describe()}")
    if not res.found:
        verdict = "NOT found - the root cause differs from the planted op"
    elif level in ATEN_LEVELS:
        verdict = "found - the root cause is the planted op"
    else:
        verdict = (f"found - the root cause is the call that contains the planted op "
                   f"(level {level} records no aten op)")
    click.echo("Verdict:    " + verdict)
    click.echo("")
    click.echo(f"Dumps:      {res.out_dir / 'device'}  vs  {res.out_dir / 'bench'}")
    for name, paths in sorted(res.result.reports.items()):
        for p in paths:
            click.echo(f"Report:     {p}  ({name})")
    click.echo(f"Again:      torchparity compare {res.out_dir / 'device'} {res.out_dir / 'bench'} -o {res.out_dir / 'report'}")
    click.echo(f"({res.seconds:.1f} s)")
    raise SystemExit(EXIT_OK if res.found else EXIT_FINDINGS)
