"""What every consumer of the op stream (:mod:`.op_stream`) gets: the op (:class:`OpInfo`, once per
overload), the call (:class:`OpCall`: phase, name within the step, module on demand), and the
consumer base class (:class:`OpConsumer`) with its chain layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import ops as opinfo

#: :attr:`OpConsumer.layer` of consumers that only observe (outermost)
LAYER_OBSERVER = 0
#: :attr:`OpConsumer.layer` of consumers that change how an op computes (innermost)
LAYER_DEVICE = 100

#: ops the dump's naming does not count (bookkeeping, metadata queries)
UNCOUNTED_OPS = frozenset({"detach", "alias", "lift_fresh", "_local_scalar_dense", "is_same_size",
                           "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel",
                           "sym_storage_offset"})

@dataclass(frozen=True)
class OpInfo:
    """What an op overload is, computed once per overload and shared by every consumer."""

    func: Any
    base: str  #: ``mm``, ``add_``
    namespace: str  #: ``aten``, ``c10d``
    op: str  #: ``aten.mm.default``
    prefix: str  #: ``Aten`` or ``Distributed`` (the dump's record prefix)
    counted: bool  #: named (and counted) like a dump record; False for bookkeeping ops
    collective: bool
    view: bool
    inplace: bool
    random: bool
    writes: tuple[tuple[int, str, bool], ...]  #: (position, name, is a tensor list) written


def make_info(func: Any) -> OpInfo:
    """The :class:`OpInfo` of an op overload."""
    base = opinfo.base_name(func)
    ns = opinfo.namespace(func)
    collective = opinfo.is_collective(func)
    return OpInfo(func=func, base=base, namespace=ns, op=str(func), prefix="Distributed" if collective else "Aten",
                  counted=not (base in UNCOUNTED_OPS or ns == "profiler"), collective=collective,
                  view=opinfo.is_view(func), inplace=opinfo.is_inplace(func), random=opinfo.is_random(func),
                  writes=opinfo.written_args(func))


class OpCall:
    """One intercepted kernel call, as every consumer sees it.

    ``phase`` and ``index`` (the call's number among ``(prefix, base, phase)`` in the step) are
    set for every counted op; the module is looked up on the first :meth:`where`.
    """

    __slots__ = ("info", "phase", "index", "_stream", "_where")

    def __init__(self, info: OpInfo, phase: str, index: int, stream: Any) -> None:  # the OpStream
        self.info = info
        self.phase = phase
        self.index = index  # -1 for uncounted ops
        self._stream = stream
        self._where: tuple[str, str | None] | None = None

    @property
    def func(self) -> Any:
        return self.info.func

    @property
    def name(self) -> str | None:
        """The dump's record name (``Aten.mm.3.forward``), None for ops the dump does not count."""
        i = self.info
        return f"{i.prefix}.{i.base}.{self.index}.{self.phase}" if self.index >= 0 else None

    @property
    def step(self) -> int:
        """The stream's step (steps ended since the stream started)."""
        return self._stream.step

    def where(self) -> tuple[str, str | None]:
        """(module path, module class) of the module running the op: the innermost running
        module in forward, the module whose forward created the autograd node in backward."""
        w = self._where
        if w is None:
            w = self._where = self._stream.module_of(self.phase)
        return w

    @property
    def module(self) -> str:
        return self.where()[0]


class OpConsumer:
    """Base class of a consumer of the op stream (see the module doc).

    Override :meth:`on_op`; the default passes the call on. Attach with
    :meth:`OpStream.attach` (or ``with stream.attached(consumer):``).
    """

    #: position in the chain: :data:`LAYER_OBSERVER` (outside) .. :data:`LAYER_DEVICE` (inside)
    layer: int = LAYER_OBSERVER
    #: set to True to have the stream track modules (``OpCall.where()``); costs module hooks
    needs_modules: bool = False
    #: set to True if torch.compile'd modules may run compiled under this consumer (torch >= 2.9),
    #: seen as their outputs and the kernels they call through the dispatcher (capture/compiled.py)
    sees_compiled_modules: bool = False

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        """Handle one op: return ``run(*args, **kwargs)`` (the rest of the chain and the kernel),
        observing the arguments before and the result after, or compute the result another way
        (device-layer consumers). Never change ``args`` in place."""
        return run(*args, **kwargs)

    def on_step_end(self, step: int) -> None:
        """The stream's step ``step`` ended (``optimizer.step()`` of the first optimizer, or
        :meth:`OpStream.next_step`), before name counters are reset."""

    def on_detach(self) -> None:
        """The consumer left the stream."""
