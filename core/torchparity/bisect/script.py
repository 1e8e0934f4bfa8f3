"""The user's side of a bisect: a script with an entry function, run deterministically.

The entry function is called once per run (reference, baseline target, every re-run) after
seeding Python, NumPy and torch with the same seed, so two runs differ only in what the bisect
changed. It returns the output to judge: a tensor, a number, a mapping/sequence of them, or a
**list with one such output per step** (then ``step`` picks one; otherwise ``step`` must be 0).
With ``target="native"`` it takes a ``target`` keyword argument: True for the run on the target
precision/device, False for the reference.
"""

from __future__ import annotations

import importlib.util
import inspect
import random
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError


def load_entry(script: str | Path, entry: str) -> Callable[..., Any]:
    """The function ``entry`` of the Python file ``script`` (one-line UsageError when absent)."""
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"bisect: script {str(path)!r} does not exist; give the path of a Python file "
                         f"that defines the entry function")
    if path.suffix != ".py":
        raise UsageError(f"bisect: script {str(path)!r} is not a .py file")
    name = f"_torchparity_bisect_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"bisect: cannot import {str(path)!r} as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        raise UsageError(f"bisect: {str(path)!r} line {exc.lineno}: syntax error: {exc.msg}") from None
    fn = getattr(mod, entry, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(mod).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise UsageError(f"bisect: {str(path)!r} has no function {entry!r} (functions there: "
                         f"{', '.join(found) or 'none'}); name it with --entry")
    return fn


def seed_all(seed: int) -> None:
    """Seed Python, NumPy (when installed) and torch: every run starts from the same RNG state."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def call_entry(fn: Callable[..., Any], seed: int, target: bool | None) -> Any:
    """Run the entry once from a fresh seed (``target`` passed only for the native mode)."""
    seed_all(seed)
    if target is None:
        return fn()
    return fn(target=target)


def pick_step(outputs: Any, step: int, script: str) -> Any:
    """The output of ``step``: ``outputs[step]`` for a per-step list, ``outputs`` itself for step 0."""
    if isinstance(outputs, list):
        if not 0 <= step < len(outputs):
            raise UsageError(f"bisect: step {step} is out of range: {script!r} returned outputs for "
                             f"{len(outputs)} step(s) (0..{len(outputs) - 1}); pass --step within it")
        return outputs[step]
    if step != 0:
        raise UsageError(f"bisect: step {step} is out of range: {script!r} returned one output (step 0); "
                         f"return a list with one output per step to bisect a later step")
    return outputs
