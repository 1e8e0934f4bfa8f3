"""Which module is running: an ordered stack of module paths, maintained by global module hooks.

PyTorch's ``torch.utils.module_tracker.ModuleTracker`` (torch >= 2.4) keeps its parents in an
unordered set and cannot tell two calls of a shared module apart; it is also absent from the
torch 2.1-2.3 releases that vendor stacks pin. This tracker uses the same public machinery
(``register_module_forward_pre_hook`` / ``register_module_forward_hook`` with ``always_call``,
available since torch 2.0) and keeps an ordered stack plus per-step call counters, which is what
op naming and matching need.

Module paths are the ``named_modules()`` names relative to a root: the model passed to
:meth:`ModuleTracker.add_root`, or else the first module seen running with no known parent (its
children are named on the fly, like ``ModuleTracker._get_mod_name`` does).

A module's own forward hooks run inside its frame: what a hook computes (or writes) belongs to the
hooked module, not to its parent. PyTorch runs the global forward hooks *before* the module's own
ones, so for a module with forward hooks of its own the frame is closed by a hook of the tracker
kept last in the module's hook table (see :meth:`ModuleTracker._pre`).

Backward attribution: autograd nodes created while a module runs are tagged (in
``grad_fn.metadata``) with the module path by :func:`tag_graph`; during backward,
:func:`current_backward_module` reads the tag of the node being executed. With the autograd
sequence number taken when the module was entered (``Frame.seq0``, when the tracker is asked for
it), the walk goes through nodes its submodules tagged to reach the ones the module created between
them (the MLP's ``mul`` before ``down_proj``), and never past the nodes created before the call.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from .compiled import is_compiling

_META_KEY = "torchparity"
#: calls a ``walked`` dict remembers at most (see :func:`tag_graph`)
_WALKED_LIMIT = 100_000


@dataclass
class Frame:
    """One active module call."""

    module: torch.nn.Module
    path: str
    cls: str
    call_index: int  # how many times this module path ran before in this step (0-based)
    recompute: bool  # forward re-run during backward (activation checkpointing)
    seq0: int | None = None  # autograd sequence number of the first node this call may create


_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # torch >= 2.0
_current_node = getattr(torch._C, "_current_autograd_node", None)


def _in_backward() -> bool:
    """True while autograd runs a backward pass on this thread (every captured op asks)."""
    return _graph_task_id is not None and _graph_task_id() != -1


def class_name(module: torch.nn.Module) -> str:
    """A module's class name; a ``torch.compile``'d module (Dynamo's ``OptimizedModule``) is named by
    the module it compiles, as in an eager run (compiled blocks: ``LlamaDecoderLayer``)."""
    while type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
        module = module._orig_mod
    return type(module).__name__


class ModuleTracker:
    """Tracks the stack of running modules and names them by path.

    Use as a context manager, or ``start()``/``stop()``. Listeners get ``on_enter(frame, args,
    kwargs)`` and ``on_exit(frame, args, kwargs, output)``; exceptions in listeners propagate (tools
    must not swallow errors silently) but the stack is kept consistent.
    """

    def __init__(self) -> None:
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._counts: dict[str, int] = {}
        self._handles: list[Any] = []
        self.on_enter: list[Callable[..., None]] = []
        self.on_exit: list[Callable[..., None]] = []
        self.known_modules: list[tuple[str, str, str | None]] = []  # (path, class, parent) first-seen
        self._roots: list[torch.nn.Module] = []
        #: take each call's autograd sequence number at entry (Frame.seq0), for tag_graph(since=)
        self.want_seq = False
        # modules with forward hooks of their own -> the tracker's hook closing the frame after them
        self._tails: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()

    # ---- naming ----------------------------------------------------------------------------
    def add_root(self, model: torch.nn.Module, prefix: str = "") -> None:
        """Name every submodule of ``model`` by its ``named_modules()`` path."""
        self._roots.append(model)
        for name, mod in model.named_modules():
            path = f"{prefix}.{name}" if prefix and name else (prefix or name)
            if mod not in self._names:
                self._names[mod] = path
                parent = path.rsplit(".", 1)[0] if "." in path else ("" if path else None)
                self.known_modules.append((path, class_name(mod), parent))

    def name_of(self, module: torch.nn.Module) -> str:
        name = self._names.get(module)
        if name is not None:
            return name
        # Unknown module: a child of the running module (name it by attribute), or a new root.
        stack = self.stack
        if stack:
            parent = stack[-1]
            for child_name, child in parent.module.named_children():
                if child is module:
                    path = f"{parent.path}.{child_name}" if parent.path else child_name
                    self.add_root(module, path)
                    return path
        self.add_root(module, "")
        return ""

    # ---- stack -----------------------------------------------------------------------------
    @property
    def stack(self) -> list[Frame]:
        s = getattr(self._local, "stack", None)
        if s is None:
            s = self._local.stack = []
        return s

    def current(self) -> Frame | None:
        s = getattr(self._local, "stack", None)  # every captured op asks: no property, no list made
        return s[-1] if s else None

    def current_path(self) -> str:
        s = self.stack
        return s[-1].path if s else ""

    def current_class(self) -> str | None:
        s = self.stack
        return s[-1].cls if s else None

    def new_step(self) -> None:
        self._counts.clear()

    # ---- hooks -----------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if is_compiling():  # Dynamo traces a compiled function's modules: no frame (see _post)
            return None
        path = self.name_of(module)
        cls = type(module).__name__
        if cls == "OptimizedModule":  # a torch.compile'd module: named by the module it compiles
            cls = class_name(module)
        key = path + "|" + cls
        idx = self._counts.get(key, 0)
        self._counts[key] = idx + 1
        frame = Frame(module, path, cls, idx, _in_backward())
        if self.want_seq and not frame.recompute and torch.is_grad_enabled():
            frame.seq0 = _sequence_nr()
        if module._forward_hooks:
            self._keep_tail_last(module)
        self.stack.append(frame)
        replaced = None
        for fn in self.on_enter:
            new_args = fn(frame, args if replaced is None else replaced, kwargs)
            if new_args is not None:
                replaced = new_args
        return replaced

    def _keep_tail_last(self, module: torch.nn.Module) -> None:
        """Make the tracker's own forward hook the module's last one (registered on first sight,
        moved to the end if the user added hooks since): the frame closes after the user's hooks."""
        hooks = module._forward_hooks
        handle = self._tails.get(module)
        if handle is None or handle.id not in hooks:
            handle = module.register_forward_hook(lambda m, a, o: self._tail(m, a, o), always_call=True)
            self._tails[module] = handle
        elif next(reversed(hooks)) != handle.id:
            hooks.move_to_end(handle.id)

    def _tail(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not is_compiling():
            self._close(module, args, {}, output)

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The global forward hook: closes the frame unless the module's own hooks are still to
        run (then :meth:`_tail` closes it, after them).

        Both global hooks do nothing while Dynamo traces a ``torch.compile``'d function that calls
        modules (:func:`.compiled.is_compiling`): traced, the tracker's bookkeeping would break
        the user's graph into pieces and change its numerics; the compiled code then runs
        inside the frame of the module that called it."""
        if is_compiling():
            return
        handle = self._tails.get(module)
        if handle is not None and handle.id in module._forward_hooks:
            return
        self._close(module, args, kwargs, output)

    def _close(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        stack = self.stack
        # pop until this module's frame (a forward that raised may have left frames behind)
        frame = None
        while stack:
            f = stack.pop()
            if f.module is module:
                frame = f
                break
        if frame is None:
            return
        for fn in self.on_exit:
            fn(frame, args, kwargs, output)

    def start(self) -> "ModuleTracker":
        from torch.nn.modules import module as mm

        self._handles = [
            mm.register_module_forward_pre_hook(lambda m, a: self._pre(m, a, {})),  # may return new args
            mm.register_module_forward_hook(lambda m, a, o: self._post(m, a, {}, o), always_call=True),
        ]
        return self

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for h in list(self._tails.values()):
            h.remove()
        self._tails = weakref.WeakKeyDictionary()
        self.stack.clear()

    def __enter__(self) -> "ModuleTracker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- backward attribution ------------------------------------------------------------------


def _sequence_nr() -> int | None:
    """The autograd sequence number the next node created on this thread will get (None if it
    cannot be read here)."""
    from .grad_capture import _peek_sequence_nr, next_sequence_nr
    from .tool_state import tool_work

    if _peek_sequence_nr is not None:
        return _peek_sequence_nr()
    try:
        with tool_work():  # the probe node is the tool's own work: no capture mode records it
            return next_sequence_nr()
    except (AttributeError, RuntimeError):
        return None


def tag_graph(outputs: Any, info: Any, stop_at: Any = None, key: str = _META_KEY, since: int | None = None,
              walked: "dict[int, tuple[Any, list[Any]]] | None" = None) -> None:
    """Tag the autograd nodes that produced ``outputs`` (and not yet tagged ones behind them).

    Walks ``grad_fn.next_functions`` from each output tensor and stops at nodes already tagged, so
    each node is tagged once, by the innermost module/op that created it. ``info`` is stored under
    ``node.metadata[key]`` (each torchparity component uses its own key, so their tags never
    override each other).

    With ``since`` (the autograd sequence number taken when the call began) the walk covers
    exactly the nodes the call created: it goes on through nodes already tagged (by submodules)
    and stops at nodes older than ``since``, so an op run between two submodules is tagged too.

    ``walked`` (with ``since``; one dict per tracker, emptied when its outermost module returns)
    remembers, per call, where its walk left the call's nodes: the nodes older than its ``since``
    it reached. A later walk that reaches a node a submodule call tagged goes on from those nodes
    instead of walking the submodule's nodes again (every node was otherwise walked once per
    enclosing module). The nodes tagged are the same, except that a node the submodule reached
    only through an output its caller dropped now gets the caller's tag instead of none.
    """
    todo = []
    # a single tensor is the common case (tree_flatten costs ~10 us even for it)
    for leaf in (outputs,) if isinstance(outputs, torch.Tensor) else tree_flatten(outputs)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
            todo.append(leaf.grad_fn)
    seen: set[int] = set()
    alive = []  # torch < 2.2 frees a node's Python wrapper with its last reference: keep them, so ids stay unique
    skip = walked if since is not None else None
    boundary: list[Any] = []  # with ``walked``: the nodes older than ``since`` the walk reached
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        alive.append(node)
        try:
            meta = node.metadata
        except (AttributeError, RuntimeError):  # AccumulateGrad and C++-only nodes
            continue
        if since is not None:
            try:
                if node._sequence_nr() < since:
                    if skip is not None:
                        boundary.append(node)
                    continue
            except (AttributeError, RuntimeError):
                continue
        elif key in meta:
            continue
        if stop_at is not None and any(node is n for n in stop_at):
            continue
        tag = meta.get(key)
        if tag is None:
            meta[key] = info
        elif skip and tag is not info:
            done = skip.get(id(tag))
            if done is not None and done[0] is tag:  # a submodule call's nodes, walked at its exit
                todo.extend(done[1])
                continue
        for fn, _ in node.next_functions:
            if fn is not None:
                todo.append(fn)
    if skip is not None:
        if len(skip) >= _WALKED_LIMIT:  # an outermost module that never returns: start again (only
            skip.clear()  # the skipping is lost; a walk missing a submodule's entry goes through its nodes)
        skip[id(info)] = (info, boundary)


def current_backward_info() -> dict[str, Any] | None:
    """The tag of the autograd node being executed (during backward), if any."""
    node = _current_node() if _current_node is not None else None
    if node is None:
        return None
    try:
        return node.metadata.get(_META_KEY)
    except (AttributeError, RuntimeError):
        return None


in_backward = _in_backward


def where_now(tracker: "ModuleTracker | None", in_optimizer: bool, key: str) -> tuple[str, str, str | None]:
    """(phase, module path, module class) of the op running now, as the dump names them.

    Forward ops belong to the innermost running module; backward ops to the module whose forward
    created the autograd node being run (tagged under ``key`` by :func:`tag_graph` with a
    ``(path, class)`` tuple); ops inside ``optimizer.step()`` are phase ``optimizer``.
    """
    frame = tracker.current() if tracker is not None else None
    if in_optimizer:
        return "optimizer", frame.path if frame else "", frame.cls if frame else None
    if in_backward():
        if frame is not None and frame.recompute:
            return "recompute", frame.path, frame.cls
        try:
            node = torch._C._current_autograd_node()
            tag = node.metadata.get(key) if node is not None else None
        except (AttributeError, RuntimeError):
            tag = None
        return ("backward", tag[0], tag[1]) if tag else ("backward", "", None)
    return "forward", frame.path if frame else "", frame.cls if frame else None

