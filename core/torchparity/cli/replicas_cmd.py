"""``torchparity replicas DIR``: do the data-parallel replicas of a dump agree? (no reference run)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ..errors import UsageError
from . import EXIT_FINDINGS, EXIT_OK

#: findings listed after the first one
SHOWN = 10


@click.command("replicas")
@click.argument("dump_dir", type=click.Path())
@click.option("-o", "--output", "output_dir", type=str, metavar="DIR", default=None,
              help="Directory for replicas.json (created). Default: console only.")
@click.option("--top", type=click.IntRange(min=0), default=SHOWN, show_default=True,
              help="Disagreements listed after the first.")
def replicas(dump_dir: str, output_dir: str | None, top: int) -> int:
    """Check that the data-parallel replicas of a dump agree, with no reference run.

    \b
    After the gradient all-reduce every data-parallel rank must hold the same gradients,
    and after the optimizer step the same parameters. This command compares them across
    the ranks of each step and names the step, parameter and rank that differ from the
    majority ("no majority" when there is none). It reads, strongest first:
      - the hashes of torchparity.dump(..., replica_check=True) (DIR/replicas/),
      - else the dump's parameter entries (level module) and optimizer-phase tensors
        (levels api/aten): saved tensors bitwise, md5, or statistics to the last bit.

    \b
    Examples:
      # in train.py (every rank): torchparity.dump("dumps/job", replica_check=True)
      torchparity replicas dumps/job
      torchparity replicas dumps/job -o out

    \b
    Exit codes: 0 the replicas agree, 1 they disagree, 2 nothing to check (one rank, no
    parameter data: the message names the option to turn on), ranks missing or from
    different world sizes (what was compared is still reported).
    """
    from ..replicas.offline import check_replicas, describe_source

    if output_dir is not None:
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise UsageError(f"replicas -o {out}: exists and is not a directory; pass a directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"replicas -o {out}: cannot create the directory ({exc.strerror or exc}); "
                             "pass a writable one") from None
    rep = check_replicas(dump_dir)
    steps = rep.steps
    span = f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0]) if steps else "none"
    click.echo(f"replica check of {dump_dir}: {len(rep.ranks)} ranks, step(s) {span}, "
               f"{rep.compared} comparisons ({describe_source(rep.source)})")
    for note in rep.notes:
        click.echo(f"torchparity: note: {note}", err=True)
    # without a disagreement the first gap becomes the one-line error below: not told twice
    for m in rep.missing[0 if rep.findings else 1:]:
        click.echo(f"torchparity: not compared: {m}", err=True)
    if rep.first is None:
        click.echo("replicas agree" + (" in everything compared" if rep.missing else ""))
    else:
        f = rep.first
        who = f"rank {f.ranks[0]}" if len(f.ranks) == 1 and not f.no_majority else \
            "no majority (ranks " + ",".join(map(str, f.ranks)) + ")"
        what = "tensor" if f.kind == "optimizer" else "parameter"
        click.echo(f"first disagreement: step {f.step}, {what} {f.name}, {who}")
        click.echo(f"  {f.describe()}")
        rest = rep.findings[1:]
        if rest:
            click.echo(f"  {len(rep.findings)} disagreement(s) in all:")
            for g in rest[:top]:
                click.echo(f"    {g.describe()}")
            if len(rest) > top:
                click.echo(f"    ... and {len(rest) - top} more (all in replicas.json with -o)")
    if output_dir is not None:
        path = Path(output_dir) / "replicas.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(rep.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, path)
        click.echo(f"wrote {path}")
    if rep.findings:
        return EXIT_FINDINGS
    if rep.missing:
        raise UsageError(f"replicas: {rep.missing[0]}" + (f" (and {len(rep.missing) - 1} more gap(s))"
                                                          if len(rep.missing) > 1 else "")
                         + "; everything else agrees")
    return EXIT_OK
