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


def _start() -> None:
    opts = os.environ.get("TORCHPARITY_RUN_OPTIONS")
    if not opts:
        return
    import json

    try:
        from torchparity.dump.api import dump

        d = dump(**json.loads(opts))
        d.start()
        sys.modules["torchparity"]._run_dumper = d  # type: ignore[attr-defined]
    except Exception as exc:  # never stop the user's script
        print(f"torchparity: error: could not start the dump: {exc}", file=sys.stderr)


_chain_next_sitecustomize()
_start()
