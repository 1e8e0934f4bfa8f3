"""Precision bisect: re-run a divergent target with modules/ops promoted to a higher precision and
find the smallest set whose promotion removes the divergence (docs/bisect.md)."""

from __future__ import annotations

import sys
import types
from typing import Any

from .api import TARGETS, bisect
from .report import BisectReport

__all__ = ["bisect", "BisectReport", "TARGETS"]


class _CallableModule(types.ModuleType):
    """``torchparity.bisect`` is both this package and the function: importing the package binds
    the name ``torchparity.bisect`` to the module, so the module itself calls :func:`bisect`."""

    def __call__(self, *args: Any, **kwargs: Any) -> BisectReport:
        return bisect(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
