"""``torchparity replay CASE [--backend cpu]``: re-run one failure case saved by online compare."""

from __future__ import annotations

import json

import click

from . import EXIT_FINDINGS, EXIT_OK


@click.command("replay")
@click.argument("case", type=click.Path(exists=True))
@click.option("--backend", "-b", default=None, metavar="NAME",
              help="Re-run the op on this backend (cpu, cuda, npu, musa, emulated ...). "
                   "Default: judge the device outputs saved in the case.")
@click.option("--reference", default=None, metavar="NAME",
              help="Reference backend (default: the one the case was compared against).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def replay(case: str, backend: str | None, reference: str | None, as_json: bool) -> int:
    """Re-run one failing op saved by CompareWithReference(save_failures=DIR) and print its verdict.

    \b
    Example:
      torchparity replay failures/step0_rank0_Aten.mm.5.forward
      torchparity replay failures/step0_rank0_Aten.mm.5.forward --backend cuda

    Exit codes: 0 the op passes now, 1 it fails (error), 2 bad input.
    """
    from ..online.replay import replay as run_replay

    res = run_replay(case, backend=backend, reference=reference)
    if as_json:
        out = {"case": res.case, "name": res.name, "op": res.op, "verdict": res.verdict, "reason": res.reason,
               "saved_verdict": res.saved_verdict, "reproduced": res.reproduced, "ran_on": res.ran_on,
               "metrics": res.metrics, "worst": res.failure.worst if res.failure else []}
        click.echo(json.dumps(out, indent=1, default=str))
    else:
        click.echo(res.report())
    return EXIT_FINDINGS if res.verdict == "error" else EXIT_OK
