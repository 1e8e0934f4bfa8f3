"""``torchparity run``: dump an unmodified training script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from ..capture.options import LIGHT_TIERS
from ..records import LEVELS, MODES


_PY_OPTS_WITH_VALUE = {"-W", "-X", "-Q"}


def python_script(cmd: list[str]) -> str | None:
    """The script a ``python [options] script.py ...`` command runs; None for ``-m``, ``-c``,
    ``-`` (stdin) or a command that is not Python (torchrun, a shell script...)."""
    if not cmd or not re.fullmatch(r"python[0-9.]*(\.exe)?", os.path.basename(cmd[0])) and cmd[0] != sys.executable:
        return None
    args = iter(cmd[1:])
    for a in args:
        if a in ("-m", "-c", "-"):
            return None
        if a in _PY_OPTS_WITH_VALUE:
            next(args, None)
            continue
        if a.startswith("-"):
            if a[1:2] in ("m", "c"):  # -mpkg, -c'code'
                return None
            continue
        return a
    return None


#: environment variable naming the folder where each process of a ``run`` leaves ``PID.ok`` when its
#: dump started, or ``PID.failed`` (the reason) when it could not (dump/_autostart/sitecustomize.py)
STATUS_ENV = "TORCHPARITY_RUN_STATUS"


def _start_status(folder: Path) -> tuple[int, list[str]]:
    """(processes whose dump started, reasons of those whose dump could not start)."""
    started, failed = 0, []
    try:
        for f in sorted(folder.iterdir()):
            if f.suffix == ".ok":
                started += 1
            elif f.suffix == ".failed":
                failed.append(" ".join(f.read_text(errors="replace").split()) or "unknown reason")
    except OSError:
        pass
    return started, failed


def _dump_written_since(root: Path, t0: float) -> bool:
    """True when a process of this run started a dump in ``root`` (it rewrites torchparity.json)."""
    try:
        return (root / "torchparity.json").stat().st_mtime >= t0
    except OSError:
        return False


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Dump directory (created).")
@click.option("--level", type=click.Choice(LEVELS), default="aten", show_default=True,
              help="module: nn.Module calls; api: torch/functional/Tensor calls; aten: every kernel incl. backward and optimizer; mix: module+api.")
@click.option("--mode", type=click.Choice(MODES), default="statistics", show_default=True,
              help="statistics: max/min/mean/norm/NaN/Inf per tensor; md5: plus a checksum; tensor: plus full tensors (safetensors).")
@click.option("--steps", default=None, help="Steps to dump, e.g. '0,2,5-7' (default: all).")
@click.option("--every", type=int, default=None,
              help="Capture fully only on steps 0, N, 2N, ... (with --steps: those of them in the list).")
@click.option("--light", type=click.Choice([t for t in LIGHT_TIERS if t]), default=None,
              help="What the steps not captured fully record: module = module records (statistics, NaN/Inf counts) only. Needs --every or --steps.")
@click.option("--ranks", default=None, help="Ranks to dump, e.g. '0' or '0-3' (default: all).")
@click.option("--ops", multiple=True, help="Only ops matching this pattern (fnmatch on name or op, or 're:REGEX'). Repeatable.")
@click.option("--exclude-ops", multiple=True, help="Skip ops matching this pattern. Repeatable.")
@click.option("--scope", multiple=True, help="Only ops inside modules matching this path pattern (e.g. 'layers.1*'). Repeatable.")
@click.option("--phases", default=None, help="Comma list of forward,backward,optimizer,recompute (default: all).")
@click.option("--max-bytes", type=int, default=None, help="Stop saving tensors after this many bytes (records continue).")
@click.option("--config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Options from a YAML file or an msprobe config.json (command-line options win).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(output: str, level: str, mode: str, steps: str | None, every: int | None, light: str | None, ranks: str | None, ops: tuple[str, ...],
        exclude_ops: tuple[str, ...], scope: tuple[str, ...], phases: str | None, max_bytes: int | None,
        config: str | None, command: tuple[str, ...]) -> int:
    """Run COMMAND (a Python training script, or torchrun) with a dump active, unmodified.

    \b
    Examples:
      torchparity run -o dumps/npu -- python train.py --lr 1e-4
      torchparity run -o dumps/gpu --level api --steps 0-1 -- torchrun --nproc-per-node 2 train.py
      torchparity run -o dumps/long --every 100 --light module -- python train.py

    Every Python process started by COMMAND dumps its own rank into OUTPUT/step{S}/rank{R}/.
    Steps advance on optimizer.step(). The exit code is COMMAND's, or 2 when COMMAND
    succeeded but none of its processes could start the dump (e.g. another run is
    dumping into OUTPUT).
    """
    from ..dump.options import DumpOptions, _ranges, check_output_dir, load_options_file
    from ..errors import UsageError
    from . import AUTOLOAD_FORCED

    def parse_list(text: str | None, what: str) -> list[int] | None:
        if not text:
            return None
        return _ranges([t.strip() for t in text.split(",") if t.strip()], what)

    opts: dict = dict(load_options_file(config)) if config else {}
    opts.update(path=str(Path(output).resolve()), level=level, mode=mode)
    if steps:
        opts["steps"] = parse_list(steps, "steps")
    if every is not None:
        opts["every"] = every
    if light is not None:
        opts["light"] = light
    if ranks:
        opts["ranks"] = parse_list(ranks, "ranks")
    if ops:
        opts["ops"] = list(ops)
    if exclude_ops:
        opts["exclude_ops"] = list(exclude_ops)
    if scope:
        opts["scope"] = list(scope)
    if phases:
        opts["phases"] = [p.strip() for p in phases.split(",") if p.strip()]
    if max_bytes is not None:
        opts["max_bytes"] = max_bytes
    DumpOptions(**opts)  # validate here: a bad option is a usage error before the script starts
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given; usage: torchparity run -o DIR -- python train.py")
    script = python_script(cmd)
    if script is not None and not Path(script).is_file():
        raise UsageError(f"script {script} does not exist; nothing was run and no dump was written")
    check_output_dir(opts["path"], "-o/--output")  # one line before the script starts, not a failed dump after
    env = dict(os.environ)
    if AUTOLOAD_FORCED:
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the user's script loads its device as usual
    autostart = str(Path(__file__).resolve().parent.parent / "dump" / "_autostart")
    env["PYTHONPATH"] = autostart + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHPARITY_RUN_OPTIONS"] = json.dumps(opts)
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    t0 = time.time() - 0.01  # coarse file-system clocks: never miss this run's own write
    status = Path(tempfile.mkdtemp(prefix="torchparity-run-"))
    env[STATUS_ENV] = str(status)
    try:
        proc = subprocess.run(cmd, env=env)
        started, failed = _start_status(status)
    except FileNotFoundError:
        raise UsageError(f"command not found: {cmd[0]}") from None
    except PermissionError:
        raise UsageError(f"command {cmd[0]} cannot be executed (permission denied)") from None
    finally:
        shutil.rmtree(status, ignore_errors=True)
    rc = proc.returncode
    if failed and not started:  # e.g. another run holds the directory: its files are not this run's dump
        click.echo(f"torchparity: error: no dump was written to {opts['path']} by this run: the dump could not "
                   f"start (see the error above)", err=True)
        return rc if rc != 0 else 2
    if not started and not _dump_written_since(Path(opts["path"]), t0):
        click.echo(f"torchparity: no dump was written to {opts['path']}: the command (exit code {rc}) started no "
                   f"Python process that reached the dump", err=True)
    elif failed:
        click.echo(f"torchparity: {len(failed)} process(es) of the command could not start their dump (see the "
                   f"error above); what the others wrote is in {opts['path']}", err=True)
    elif rc != 0:
        click.echo(f"torchparity: the command failed (exit code {rc}); what it ran before is in {opts['path']} "
                   f"(see `torchparity info {opts['path']}`)", err=True)
    else:
        click.echo(f"torchparity: dump written to {opts['path']}", err=True)
    return rc
