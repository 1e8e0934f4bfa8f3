"""When torchparity may start worker processes on its own (compact, compare).

Worker processes are started with ``spawn`` (the caller may have threads: a training job's,
torch's). A spawned worker imports the parent's ``__main__`` file again: a user's script without
an ``if __name__ == "__main__":`` guard would run again in every worker, and its own call of
``torchparity.compare`` there fails ("An attempt has been made to start a new process before the
current process has finished its bootstrapping phase"). So the automatic choice of workers
(``workers=None``) only spreads work over processes when the main module is safe to import
again: none (``python -c``, a REPL, a notebook), torchparity's own command line, or a file whose
top level has that guard. A script without it runs in one process unless it asks for workers
(``workers=N``).
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Sequence


def automatic_workers_allowed() -> bool:
    """May ``workers=None`` start worker processes in this process? (see the module docstring)"""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:  # python -c, a REPL, a notebook: nothing is imported again
        return True
    p = Path(path)
    if p.name == "torchparity" or (p.name == "__main__.py" and p.parent.name == "torchparity"):
        return True  # the console script, python -m torchparity
    return _guarded(str(p))


@functools.lru_cache(maxsize=8)
def _guarded(path: str) -> bool:
    """Does the file's top level run its work under ``if __name__ == "__main__":``?"""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            sides = [node.test.left, node.test.comparators[0]]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            consts = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and consts == ["__main__"]:
                return True
    return False


def map_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, chunksize: int = 1) -> list[Any]:
    """``[fn(job) for job in jobs]``, in this process (``workers <= 1``) or in a pool of spawned
    processes (spawn, not fork: the caller may have threads, a training job's or torch's), results
    in the order of ``jobs``. ``fn`` must be a module-level function, ``jobs`` picklable."""
    n = len(jobs)
    if workers <= 1 or n <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(workers, n), mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(fn, jobs, chunksize=chunksize))
