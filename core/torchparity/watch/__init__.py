"""``torchparity.watch``: an always-on watchdog that re-runs the bad step under full capture."""

from .api import Watch, WatchTriggered, watch
from .options import EXIT_CODE, WatchOptions
from .triggers import Trigger

__all__ = ["watch", "Watch", "WatchTriggered", "WatchOptions", "Trigger", "EXIT_CODE"]


class _CallablePackage(__import__("types").ModuleType):
    """``torchparity.watch`` is this package once a submodule was imported (Python sets the
    attribute), and the function before: calling the package calls :func:`watch`."""

    def __call__(self, *args: object, **kwargs: object) -> Watch:
        return watch(*args, **kwargs)  # type: ignore[arg-type]


__import__("sys").modules[__name__].__class__ = _CallablePackage
