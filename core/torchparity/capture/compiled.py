"""``torch.compile``'d modules and the capture modes that would run them eagerly.

A ``TorchDispatchMode`` (the op stream: the aten-level dump, the NaN/Inf tracker, online compare)
or the API level's ``TorchFunctionMode`` on the stack makes Dynamo run a compiled module's frames
eagerly (or, at the API level, fail inside Dynamo): the user's numerics would silently change from
the compiled run's to the eager run's, which the tool must never do. Until capture inside compiled
graphs exists for a tool, it refuses a compiled model with one line naming the alternatives:
when it starts with the model, and when a compiled module is first called while it runs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..errors import UsageError


def _optimized_module_type() -> type | None:
    try:
        from torch._dynamo.eval_frame import OptimizedModule

        return OptimizedModule
    except Exception:  # pragma: no cover - torch without Dynamo
        return None


_OPTIMIZED = _optimized_module_type()


#: torch 2.1's Dynamo fails on the module-level capture's hooks (they make a tensor while it traces):
#: there even a module-level dump of a compiled model is refused; from 2.2 on (checked on 2.13) it
#: runs the compiled code with its own numerics
MODULE_LEVEL_OK = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 2)


#: torchparity.dump(level="aten") captures a compiled model's graphs (compile/in_dump.py) from
#: torch 2.2 on (the compile backend's floor); before, it refuses it
COMPILED_DUMP_OK = MODULE_LEVEL_OK


def is_compiled(module: Any) -> bool:
    """Is ``module`` a ``torch.compile``'d module (Dynamo's ``OptimizedModule`` wrapper)?"""
    return _OPTIMIZED is not None and isinstance(module, _OPTIMIZED)


#: compiled modules whose compiled graphs a dump captures (compile/in_dump.py): not refused
_CAPTURED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def allow_compiled(module: Any) -> None:
    """``module``'s compiled graphs are captured (it does not run eagerly): let it be called."""
    _CAPTURED.add(module)


def disallow_compiled(module: Any) -> None:
    _CAPTURED.discard(module)


class CompiledModelError(UsageError):
    """A capture that would run a ``torch.compile``'d model eagerly (and so change its numerics)."""


def refusal(what: str, hint: str = "") -> CompiledModelError:
    """The one-line refusal for ``what`` (e.g. "the NaN/Inf tracker"); ``hint``: what that tool's
    user can do instead with the compiled model itself (a consumer's ``compiled_hint``)."""
    module_level = " or (one process) dump the compiled model at level='module';" if MODULE_LEVEL_OK else ""
    graphs = f" {hint};" if hint and COMPILED_DUMP_OK else ""
    return CompiledModelError(
        f"{what} cannot watch a torch.compile'd model: it would run the model eagerly and change its "
        f"numerics. Use it on the eager model (model._orig_mod, or without torch.compile),{module_level}"
        f"{graphs} see docs/compile.md")


def refuse_compiled(model: Any, what: str, hint: str = "") -> None:
    """Raise :func:`refusal` when ``model`` is compiled."""
    if is_compiled(model):
        raise refusal(what, hint)


class CompiledCallGuard:
    """While installed, calling a compiled module raises :func:`refusal` (one global forward
    pre-hook: a type check per module call)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._handle: Any = None

    def install(self) -> None:
        if self._handle is None and _OPTIMIZED is not None:
            self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._check)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _check(self, module: Any, args: Any) -> None:
        if (type(module) is _OPTIMIZED or is_compiled(module)) and module not in _CAPTURED:
            raise refusal(self.what)
