"""Where an op runs: step, phase, module path and its dump-style record name.

Online tools (compare, trackers) run without a dump, yet must name ops exactly like the dump's aten
records (``Aten.mm.3.forward``) so that their findings line up with dumps and with the emulated
device's fault indices. :class:`OpLocator` keeps the same counters (per ``Aten.<op>.<phase>`` in a
step, the dump's bookkeeping ops excluded), follows modules with the dump's
:class:`~torchparity.capture.module_tracker.ModuleTracker`, attributes backward ops to the module
whose forward created their autograd node (its own ``grad_fn.metadata`` key, so a dump running at
the same time keeps its tags), and advances the step on ``optimizer.step()``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..capture import ops as opinfo
from ..capture.aten_mode import _SKIP as UNCOUNTED_OPS
from ..capture.module_tracker import Frame, ModuleTracker, tag_graph, where_now

_META_KEY = "torchparity.online"


class OpLocator:
    """Step/phase/module tracking and dump-compatible op naming. Use as a context manager."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self.step = 0
        self.tracker = ModuleTracker()
        if model is not None:
            self.tracker.add_root(model)
        self.tracker.on_exit.append(self._tag_backward)
        self.tracker.want_seq = True
        self.in_optimizer = False
        self._first_optimizer: int | None = None
        self._hooks: list[Any] = []
        self._counters: dict[tuple[str, str, str], int] = {}
        self._step_listeners: list[Any] = []

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> "OpLocator":
        import torch.optim.optimizer as optim_mod

        self.tracker.start()
        self._hooks = [
            optim_mod.register_optimizer_step_pre_hook(self._on_opt_pre),
            optim_mod.register_optimizer_step_post_hook(self._on_opt_post),
        ]
        return self

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.tracker.stop()

    def __enter__(self) -> "OpLocator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def on_step_end(self, fn: Any) -> None:
        """Call ``fn(step)`` when a step ends (before the counter advances)."""
        self._step_listeners.append(fn)

    def next_step(self) -> None:
        for fn in self._step_listeners:
            fn(self.step)
        self.step += 1
        self._counters.clear()
        self.tracker.new_step()

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_optimizer = True

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_optimizer = False
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        if id(optimizer) == self._first_optimizer:  # several optimizers: one step per iteration
            self.next_step()

    # ---- where ----------------------------------------------------------------------------
    def _tag_backward(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        tag_graph(output, (frame.path, frame.cls), key=_META_KEY, since=frame.seq0)

    def where(self) -> tuple[str, str, str | None]:
        """(phase, module path, module class) of the op running now."""
        return where_now(self.tracker, self.in_optimizer, _META_KEY)

    def name(self, func: Any, phase: str) -> str | None:
        """The dump's record name for this call (advances the counter), or ``None`` for the ops
        the dump does not record."""
        base = opinfo.base_name(func)
        if base in UNCOUNTED_OPS or opinfo.namespace(func) == "profiler":
            return None
        prefix = "Distributed" if opinfo.is_collective(func) else "Aten"
        key = (prefix, base, phase)
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        return f"{prefix}.{base}.{n}.{phase}"
