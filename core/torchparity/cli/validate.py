"""Click types and callbacks that validate options before any work starts.

Every bad value is a :class:`click.BadParameter`, which :func:`torchparity.cli.main` prints as
one line (``torchparity: error: ...``) with exit code 2.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import click

#: a step or rank: a whole number >= 0
INDEX = click.IntRange(min=0)
#: worker processes: a whole number >= 1
WORKERS = click.IntRange(min=1)


def amplification(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """An amplification threshold: a finite number > 1 (NaN and inf are refused: a NaN threshold
    would silently make no op a suspect)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 1:
        raise click.BadParameter(f"{value!r} is not a finite number > 1 (an output/input error ratio, e.g. 10)",
                                 ctx=ctx, param=param)
    return value


_ATTEMPTS = 50  # looks at a directory other ranks create and remove at the same moment


def _is_dir(path: Path) -> bool | None:
    """True for a directory, False for anything else, None when nothing is there: one ``stat``
    (``exists()`` then ``is_dir()`` can see a directory another rank removes in between)."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except FileNotFoundError:
        return None


def output_dir(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """An output directory that exists or can be created, and can be written to. Checked up
    front (the reports come last, after the whole comparison); nothing is left behind: parts the
    check created are removed again."""
    if value is None:
        return None
    p = Path(value)
    if _is_dir(p) is False:
        raise click.BadParameter(f"{value} is a file; give a directory (it is created if missing)", ctx=ctx, param=param)
    made: list[Path] = []
    try:
        # under torchrun every rank checks the same directory at once: one may create it while
        # another does (FileExistsError: theirs, fine), or remove what it created while another
        # looks at it or probes in it (FileNotFoundError, or an ancestor gone: look again)
        for attempt in range(_ATTEMPTS):
            missing: list[Path] = []
            q = p
            while not q.exists() and q != q.parent:
                missing.append(q)
                q = q.parent
            try:
                kind = _is_dir(q)
                if kind is None:  # gone since it was seen
                    raise FileNotFoundError(str(q))
                if not kind:
                    raise click.BadParameter(f"{q} is not a directory, so {value} cannot be created there",
                                             ctx=ctx, param=param)
                for m in reversed(missing):
                    try:
                        m.mkdir()
                        made.append(m)
                    except FileExistsError:  # another rank's, fine; unless it is not a directory
                        kind = _is_dir(m)
                        if kind is None:  # ... or gone again already: look again
                            raise FileNotFoundError(str(m)) from None
                        if not kind:
                            raise
                fd, probe = tempfile.mkstemp(dir=p, prefix=".torchparity-probe-")
                os.close(fd)
                os.unlink(probe)
                break
            except FileNotFoundError:
                if attempt == _ATTEMPTS - 1:
                    raise
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise click.BadParameter(f"cannot write to {value} ({why}); choose a writable directory",
                                 ctx=ctx, param=param) from None
    finally:
        for m in reversed(made):
            try:
                m.rmdir()
            except OSError:
                pass
    return value
