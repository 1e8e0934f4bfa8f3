"""Gradient direction monitoring: per-parameter gradient statistics and a direction sketch per step,
and the comparison of two runs that names the first step and parameter whose gradient direction
drifts (see ``docs/gradients.md``).

* :class:`GradMonitor` (``monitor.py``) records, for every parameter and optimizer step, exact
  statistics of the gradient and a ``sketch_dim``-dimensional count-sketch projection of it,
  computed on the gradient's device, one crash-safe file per step and rank.
* :func:`load_run` (``store.py``) reads such a directory.
* :func:`compare_runs` (``compare.py``) compares two runs; the verdicts come from the
  ``grad_direction`` checker plugin.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GradMonitor", "load_run", "compare_runs", "GradCompareResult"]

_LAZY = {
    "GradMonitor": ("torchparity.gradients.monitor", "GradMonitor"),
    "load_run": ("torchparity.gradients.store", "load_run"),
    "compare_runs": ("torchparity.gradients.compare", "compare_runs"),
    "GradCompareResult": ("torchparity.gradients.compare", "GradCompareResult"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'torchparity.gradients' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(target[0]), target[1])
