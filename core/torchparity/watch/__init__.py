"""``torchparity.watch``: an always-on watchdog that re-runs the bad step under full capture.

``torchparity.watch`` is this package, and calling it calls :func:`torchparity.watch.api.watch`
(``torchparity.watch(model, optimizer, output_dir=...)``), so that ``torchparity.watch.WatchTriggered``
and ``torchparity.watch.EXIT_CODE`` are at hand whichever way it was reached first.
"""

import sys as _sys
import types as _types

from . import api as _api
from .api import Watch, WatchTriggered
from .options import EXIT_CODE, WatchOptions
from .triggers import Trigger

__all__ = ["watch", "Watch", "WatchTriggered", "WatchOptions", "Trigger", "EXIT_CODE"]


class _CallablePackage(_types.ModuleType):
    """The package, callable: ``torchparity.watch(...)`` makes a :class:`Watch`."""

    def __call__(self, *args: object, **kwargs: object) -> Watch:
        return _api.watch(*args, **kwargs)  # type: ignore[arg-type]


_sys.modules[__name__].__class__ = _CallablePackage
#: ``from torchparity.watch import watch`` and the lazy ``torchparity.watch``: this callable package
watch = _sys.modules[__name__]
