"""Started by ``torchparity run``: begin a dump in this (unmodified) Python process.

This directory is put first on PYTHONPATH by ``torchparity run``; Python imports
``sitecustomize`` at start-up. Options come as JSON in ``TORCHPARITY_RUN_OPTIONS``. An existing
``sitecustomize`` further down the path is still imported afterwards.
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _chain_next_sitecustomize() -> None:
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
        mod = sys.modules.pop("sitecustomize", None)
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != _here:
            importlib.import_module("sitecustomize")
        elif mod is not None:
            sys.modules["sitecustomize"] = mod
    except Exception:
        pass
    finally:
        sys.path[:] = saved


#: launchers of a distributed job: they train nothing, and a dump started in them took rank 0's lock
#: (no RANK in their environment), so rank 0's worker was refused and its records were lost
_LAUNCHER_SCRIPTS = ("torchrun",)
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _is_launcher() -> bool:
    """True in a ``torchrun`` / ``python -m torch.distributed.run`` launcher process."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    if sys.argv and os.path.basename(sys.argv[0]) in _LAUNCHER_SCRIPTS:
        return True
    return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] in _LAUNCHER_MODULES for i, a in enumerate(argv))


def _start() -> None:
    opts = os.environ.get("TORCHPARITY_RUN_OPTIONS")
    if not opts or _is_launcher():
        return
    import json

    try:
        from torchparity.dump.api import dump

        d = dump(**json.loads(opts))
        d.start()
        sys.modules["torchparity"]._run_dumper = d  # type: ignore[attr-defined]
        _tell_run("ok", "")
    except Exception as exc:  # never stop the user's script
        print(f"torchparity: error: could not start the dump: {exc}", file=sys.stderr)
        _tell_run("failed", str(exc))


def _tell_run(state: str, text: str) -> None:
    """Leave ``PID.<state>`` in the folder `torchparity run` reads after the command (so that it
    never calls another process's files this run's dump)."""
    folder = os.environ.get("TORCHPARITY_RUN_STATUS")
    if not folder:
        return
    try:
        with open(os.path.join(folder, f"{os.getpid()}.{state}"), "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        pass


_chain_next_sitecustomize()
_start()
