"""``torch.compile``'d modules and the capture modes that would run them eagerly.

A ``TorchDispatchMode`` (the op stream: the aten-level dump, the NaN/Inf tracker, online compare)
or the API level's ``TorchFunctionMode`` on the stack makes Dynamo run a compiled module's frames
eagerly (or, at the API level, fail inside Dynamo): the user's numerics would silently change from
the compiled run's to the eager run's, which the tool must never do. Until capture inside compiled
graphs exists for a tool, it refuses a compiled model with one line naming the alternatives:
when it starts with the model, and when a compiled module is first called while it runs.

A compiled *function* (``torch.compile(opt.step)``, a compiled loss) is not refused: it runs
compiled under every tool (the op stream's mode opts out of Dynamo's skip, and the tool code
Dynamo may trace returns at once under :data:`is_compiling`); what the tools cannot see of it is
said (:func:`compiled_functions_note`), and on torch 2.5-2.8, where it runs eagerly under a
dispatch mode, a warning says that (:func:`warn_if_compiled_functions_run_eagerly`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])  # (major, minor)
MODULE_LEVEL_OK = _TORCH >= (2, 2)


#: torchparity.dump(level="aten") captures a compiled model's graphs (compile/in_dump.py) from
#: torch 2.2 on (the compile backend's floor); before, it refuses it
COMPILED_DUMP_OK = MODULE_LEVEL_OK


def _is_compiling_fn() -> Any:
    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if f is None:
        f = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return f if f is not None else (lambda: False)


#: True while Dynamo traces a ``torch.compile``'d function (a constant it folds into the graph),
#: False when the code runs. Tool code that Dynamo may trace (the API level's function mode, the
#: module tracker's global hooks) returns at once under it: the compiled graph is then the one
#: the user gets without the tool, and so are the numerics.
is_compiling = _is_compiling_fn()


#: can a dispatch mode let torch.compile'd frames run compiled (``ignore_compile_internals``,
#: asked by Dynamo from torch 2.9 on)? From torch 2.5 (PyTorch #131828) to 2.8 Dynamo skips every
#: compiled frame while a dispatch mode is on the stack, and nothing a mode says changes that
DISPATCH_MODE_CAN_OPT_OUT = hasattr(TorchDispatchMode, "ignore_compile_internals")
_SKIPS_UNDER_MODES = _TORCH >= (2, 5)
_warned_eager = False


def eager_hook(fn: Any) -> Any:
    """``fn``, a hook the tool needs run as the user's code runs (an optimizer step hook that ends
    the tool's step, reads gradients, ...), marked so that inside a ``torch.compile``'d function
    (a compiled ``optimizer.step()``) Dynamo calls it as it is instead of tracing it: traced, the
    tool's bookkeeping would become graph side effects, or graph breaks with Dynamo's "does not
    know how to trace" warnings. Marked only when Dynamo is loaded already (importing it costs
    seconds; a process that has not loaded it has compiled nothing yet), and not on torch 2.1,
    where torchparity supports no compiled code (there a ``torch.compile`` call re-wraps every
    optimizer's ``step()`` for the whole process and no optimizer step hook fires any more;
    ``disable`` itself does no harm there, checked on 2.1.2)."""
    import sys

    disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
    return disable(fn) if disable is not None and MODULE_LEVEL_OK else fn


def _dynamo_codes() -> Any:
    """The code objects Dynamo was asked to compile in this process (weak references; None
    before any)."""
    import sys

    convert = sys.modules.get("torch._dynamo.convert_frame")
    return getattr(getattr(convert, "input_codes", None), "seen", None)


#: the code objects Dynamo compiled for a model the tool captures in graph (compile/in_dump.py):
#: not "compiled functions" the dump cannot see
_CAPTURED_CODES: weakref.WeakSet[Any] = weakref.WeakSet()


@contextlib.contextmanager
def captured_compile() -> Iterator[None]:
    """Around a call of a compiled module whose graphs the tool captures: the code Dynamo compiles
    within is that module's, and :func:`compiled_functions_note` does not count it (a compiled
    model's dump said that some compiled function outside the model ran compiled, unseen)."""
    before = len(_dynamo_codes() or ())
    try:
        yield
    finally:
        for ref in (_dynamo_codes() or [])[before:]:
            code = ref()
            if code is not None:
                _CAPTURED_CODES.add(code)


#: what a dump's step header says (``compiled_functions``) once torch.compile'd code has run in
#: the process: the dump cannot see which compiled function ran in which step
COMPILED_FUNCTIONS_NOTE = (
    "torch.compile'd code has run in this process: a compiled function called in this step outside a model "
    "the dump captures (a compiled optimizer step, loss or training step) ran compiled, and only the kernels it "
    "calls through the dispatcher (matmuls, convolutions) are recorded, not its fused kernels")
COMPILED_FUNCTIONS_EAGER_NOTE = (
    "torch.compile'd code has run in this process: on this torch (2.5 to 2.8) a compiled function called in this "
    "step outside a model the dump captures ran eagerly under the capture, with eager numerics, and is recorded "
    "op by op")


def compiled_functions_note() -> str | None:
    """The step header's ``compiled_functions`` text, or None while no compiled code has run but
    the models the tool captures in graph (:func:`captured_compile`)."""
    codes = _dynamo_codes()
    if not codes or all((c := ref()) is None or c in _CAPTURED_CODES for ref in codes):
        return None
    return COMPILED_FUNCTIONS_EAGER_NOTE if _SKIPS_UNDER_MODES and not DISPATCH_MODE_CAN_OPT_OUT \
        else COMPILED_FUNCTIONS_NOTE


def warn_if_compiled_functions_run_eagerly(what: str) -> None:
    """Once per process, on torch 2.5-2.8 and once Dynamo has met compiled code in this process:
    say that ``torch.compile``'d functions (a compiled ``optimizer.step``, loss, training step:
    not a model given to the dump, whose graphs are captured) run eagerly under ``what``, so
    their numerics are eager's there. Never said on other versions: they run compiled."""
    global _warned_eager
    if _warned_eager or DISPATCH_MODE_CAN_OPT_OUT or not _SKIPS_UNDER_MODES or not _dynamo_codes():
        return
    _warned_eager = True
    import warnings

    warnings.warn(
        f"torch {torch.__version__}: a torch.compile'd function called while {what} is on runs eagerly "
        f"(Dynamo skips compiled code under a dispatch mode from torch 2.5 to 2.8), so its numerics are "
        f"eager's while the tool is on; torch >= 2.9 keeps them compiled. A compiled model given to "
        f"torchparity.dump(model=..., level='aten') is captured compiled on every version; see docs/compile.md",
        RuntimeWarning, stacklevel=2)


def is_compiled(module: Any) -> bool:
    """Is ``module`` a ``torch.compile``'d module (Dynamo's ``OptimizedModule`` wrapper)?"""
    return _OPTIMIZED is not None and isinstance(module, _OPTIMIZED)


def compiled_blocks(model: Any) -> list[tuple[str, Any]]:
    """The ``torch.compile``'d submodules of an eager ``model`` (blocks compiled one by one, as
    large training jobs do: ``model.layers[i] = torch.compile(layer)``), outermost only, as
    ``(module path, compiled module)`` in ``named_modules`` order. Empty for a compiled model
    itself (:func:`is_compiled`) and for a model without compiled parts."""
    if _OPTIMIZED is None or model is None or is_compiled(model) or not isinstance(model, torch.nn.Module):
        return []
    out: list[tuple[str, Any]] = []
    for path, m in model.named_modules(remove_duplicate=True):
        if is_compiled(m) and not any(path.startswith(p + ".") for p, _ in out):
            out.append((path, m))
    return out


def _blocks_share_graphs() -> bool:
    """Does Dynamo trace a module's parameters as graph inputs (``inline_inbuilt_nn_modules``,
    the default from torch 2.5 on, always on in recent releases)? Then every block of one class
    runs ONE compiled graph, and the dump's capture of compiled blocks compiles each block's code
    once; without it each block is its own graph and a model with more blocks than Dynamo's
    recompile limit would run its last blocks eagerly under the capture."""
    import warnings

    try:
        import torch._dynamo.config as cfg

        with warnings.catch_warnings():  # deprecated (always True) in recent releases
            warnings.simplefilter("ignore")
            return bool(getattr(cfg, "inline_inbuilt_nn_modules", False))
    except Exception:  # pragma: no cover - torch without Dynamo
        return False


def compiled_blocks_ok() -> bool:
    """Can ``torchparity.dump(level="aten")`` capture the graphs of a model's compiled blocks here?"""
    return MODULE_LEVEL_OK and _blocks_share_graphs()


#: torch >= 2.9: a compiled module called under the op stream's dispatch mode runs compiled (the mode
#: opts out of Dynamo's frame skip, as for compiled functions). A consumer that can work with what it
#: then sees of the module (``OpConsumer.sees_compiled_modules``: its outputs, and the kernels its
#: graph calls through the dispatcher) lets it run; the others refuse it (the emulated device would not
#: emulate it, online compare could not compare inside it)
COMPILED_MODULES_RUN = DISPATCH_MODE_CAN_OPT_OUT

_QUIET: dict[type, type] = {}


def quiet_class(cls: type) -> type:
    """``cls`` (Dynamo's OptimizedModule) without its warning about global module hooks: the
    tools' own hooks return at once while Dynamo traces (:data:`is_compiling`), or are set aside
    while the compiled module runs (a dump capturing its graphs), so the warning is not true."""
    q = _QUIET.get(cls)
    if q is None:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            import warnings

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
                return cls.__call__(self, *args, **kwargs)

        q = _QUIET[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
    return q


def quiet_compiled(model: Any) -> list[tuple[Any, type]]:
    """Give ``model`` (if compiled) and its compiled blocks :func:`quiet_class`; returns what
    :func:`restore_classes` puts back."""
    mods = ([model] if is_compiled(model) else []) + [m for _, m in compiled_blocks(model)]
    saved = [(m, type(m)) for m in mods if type(m) not in _QUIET.values()]
    for m, cls in saved:
        m.__class__ = quiet_class(cls)
    return saved


def restore_classes(saved: list[tuple[Any, type]]) -> None:
    for m, cls in saved:
        m.__class__ = cls


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
    """Raise :func:`refusal` when ``model`` is compiled or holds compiled blocks
    (:func:`compiled_blocks`: named in the message, before anything runs)."""
    if is_compiled(model):
        raise refusal(what, hint)
    blocks = compiled_blocks(model)
    if blocks:
        names = ", ".join(repr(p) for p, _ in blocks[:2]) + (f" and {len(blocks) - 2} more" if len(blocks) > 2 else "")
        graphs = f" {hint};" if hint and COMPILED_DUMP_OK else ""
        raise CompiledModelError(
            f"{what} cannot watch a model whose blocks are torch.compile'd ({names}): it would run them eagerly "
            f"and change the numerics. Use it on the model without torch.compile,{graphs} see docs/compile.md")


class CompiledCallGuard:
    """While installed, calling a compiled module raises :func:`refusal` (one global forward
    pre-hook: a type check per module call)."""

    def __init__(self, what: str, allowed: Any = None) -> None:
        self.what = what
        self._allowed = allowed  # () -> bool: may compiled modules run now (COMPILED_MODULES_RUN)?
        self._handle: Any = None

    def install(self) -> None:
        if self._handle is None and _OPTIMIZED is not None:
            self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._check)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _check(self, module: Any, args: Any) -> None:
        if is_compiling():  # a module inside a compiled function, traced by Dynamo: not a call
            return
        if (type(module) is _OPTIMIZED or is_compiled(module)) and module not in _CAPTURED and \
                not (self._allowed is not None and self._allowed()):
            raise refusal(self.what)
