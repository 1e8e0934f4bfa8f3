"""Offline comparison of two dumps (see ``docs/compare.md``).

``compare(device_dump, bench_dump, output_dir=None, ...)`` returns a
:class:`~torchparity.results.CompareResult`; the submodules each do one job: matching (pair
records), metrics (per-tensor numbers), rootcause (amplification scoring), judge (checker
verdicts), api (the pipeline).
"""

from __future__ import annotations

from typing import Any


def compare(*args: Any, **kwargs: Any) -> Any:
    """See :func:`torchparity.compare.api.compare`."""
    from .api import compare as _compare

    return _compare(*args, **kwargs)
