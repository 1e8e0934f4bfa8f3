"""Dumping (capture) and reading torchparity dumps.

The reader (:mod:`torchparity.dump.reader`) imports without the capture engine; the capture API
lives in :mod:`torchparity.dump.api`.

``torchparity.dump`` is both this package and the function :func:`torchparity.dump.api.dump`:
once any submodule is imported, Python binds the package to the ``torchparity.dump`` attribute,
so the package itself is made callable and forwards to the function.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .api import dump

        return dump(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
