"""Offline comparison of two dumps (see ``docs/compare.md``).

``torchparity.compare(device_dump, bench_dump, output_dir=None, ...)`` returns a
:class:`~torchparity.results.CompareResult`; the submodules each do one job: matching (pair
records), rows (one row per tensor pair), metrics (per-tensor numbers), rootcause
(amplification scoring), judge (checker verdicts), integrity (what was not compared; verdicts
that agree with the root cause), summary (counts and reporters), api (the pipeline).

``torchparity.compare`` is both this package and the function :func:`torchparity.compare.api.compare`:
once any submodule is imported, Python binds the package to the ``torchparity.compare``
attribute, so the package itself is made callable and forwards to the function.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def compare(*args: Any, **kwargs: Any) -> Any:
    """See :func:`torchparity.compare.api.compare`."""
    from .api import compare as _compare

    return _compare(*args, **kwargs)


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
