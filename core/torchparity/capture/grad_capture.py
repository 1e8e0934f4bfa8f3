"""Gradients of one op or module call, captured without touching the autograd graph.

The backward record of a call holds its vector-Jacobian product: the gradients flowing into its
outputs (record inputs) and the gradients it sends to its inputs (record outputs), *this call's
contribution only*, not the total gradient of a tensor used in several places.

How, without changing numerics: inserting an identity node in front of each input would do it,
but it changes the order in which the autograd engine sums gradient contributions, which changes
results in the last bit. Instead we only *observe*:

* grad outputs: a tensor hook on each output (it runs on the already-summed gradient and
  returns nothing, so the value used by the engine is untouched);
* grad inputs: the nodes created by the call are exactly those whose autograd sequence number is
  at least the one taken just before the call (:func:`next_sequence_nr`). Walking back from the
  outputs through those nodes finds every edge into an input; a post-hook on the node that owns
  the edge reads ``grad_inputs[j]``. Post-hooks return nothing, so the graph is not modified.

The call's backward record is emitted once every hooked node has run (or, for the few whose
gradient never flows, at the step boundary).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_MAX_NODES = 20000  # bound on the walk through one call's subgraph
_probe: torch.Tensor | None = None


#: the per-thread counter itself, read without making a node (torch's profiler binding of
#: ``at::sequence_number::peek``: 0.02 us against ~2 us for a probe node); None where absent
_peek_sequence_nr: Any = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)


def next_sequence_nr() -> int:
    """The autograd sequence number of the next node created on this thread.

    Read from the per-thread counter where torch exposes it (it does from 2.1 on); elsewhere one
    throw-away node is created to read it. Nodes created afterwards have larger or equal numbers;
    the engine only compares sequence numbers with each other, so the probe's shift of them all
    by one changes no execution order.
    """
    if _peek_sequence_nr is not None:
        return _peek_sequence_nr()
    return _probe_sequence_nr()


def _probe_sequence_nr() -> int:
    """:func:`next_sequence_nr` by a throw-away node (torch without the counter's binding)."""
    global _probe
    if _probe is None:
        _probe = torch.zeros(0, requires_grad=True)
    # the probe's view is the tool's own op: no dispatch mode needs to see it (an op stream's
    # mode would hand it straight back, after a trip through Python: ~2/3 of this call's cost)
    with _no_dispatch_modes(), torch.enable_grad():
        return _probe.view_as(_probe).grad_fn._sequence_nr() + 1  # type: ignore[union-attr]


class _NoGuard:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


#: skips every ``__torch_dispatch__`` (modes and subclasses) for the block; a no-op where absent
_no_dispatch_modes: Any = getattr(torch._C, "_DisableTorchDispatch", _NoGuard)


class GradWatch:
    """Gradients of one call, filled in by autograd hooks during backward."""

    __slots__ = ("grads_out", "grads_in", "pending_nodes", "done", "on_complete", "meta")

    def __init__(self, on_complete: Callable[["GradWatch"], None], meta: Any = None) -> None:
        self.grads_out: list[tuple[str, torch.Tensor]] = []
        self.grads_in: dict[str, list[torch.Tensor]] = {}
        self.pending_nodes = 0
        self.done = False
        self.on_complete = on_complete
        self.meta = meta

    @property
    def has_data(self) -> bool:
        return bool(self.grads_out or self.grads_in)

    def summed_grads_in(self) -> list[tuple[str, torch.Tensor]]:
        """One gradient per input (contributions of several nodes summed, outside the graph)."""
        out = []
        for arg, parts in sorted(self.grads_in.items()):
            total = parts[0]
            for p in parts[1:]:
                total = total + p
            out.append((arg, total))
        return out

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.on_complete(self)


def _on_output_grad(watch: GradWatch, arg: str, grad: torch.Tensor) -> None:
    watch.grads_out.append((arg, grad))


def _on_node(watch: GradWatch, hits: tuple[tuple[int, str], ...], grad_inputs: Any, grad_outputs: Any) -> None:
    for j, arg in hits:
        g = grad_inputs[j] if j < len(grad_inputs) else None
        if isinstance(g, torch.Tensor):
            watch.grads_in.setdefault(arg, []).append(g)
    watch.pending_nodes -= 1
    if watch.pending_nodes <= 0:
        watch.finish()


def watch_call(inputs: list[tuple[str, torch.Tensor]], outputs: list[tuple[str, Any]], seq0: int,
               on_complete: Callable[[GradWatch], None], meta: Any = None) -> GradWatch | None:
    """Hook the gradients of one call whose autograd nodes all have sequence number >= ``seq0``.

    Returns None when no output carries a gradient (nothing to watch).
    """
    out_tensors = [(a, v) for a, v in outputs
                   if isinstance(v, torch.Tensor) and v.requires_grad and v.grad_fn is not None]
    if not out_tensors:
        return None
    watch = GradWatch(on_complete, meta)
    edges: dict[tuple[int, int], str] = {}
    leaves: dict[int, str] = {}
    # Every node object touched stays referenced until the walk ends: on torch < 2.2 a node's
    # Python wrapper dies with its last reference and a new one (with a new id) is made later.
    alive: list[Any] = []
    for arg, t in inputs:
        if not (isinstance(t, torch.Tensor) and t.requires_grad):
            continue
        if t.grad_fn is not None:
            node = t.grad_fn
            alive.append(node)
            edges[(id(node), t.output_nr)] = arg
        else:
            leaves[id(t)] = arg
    todo = []
    for arg, v in out_tensors:
        v.register_hook(functools.partial(_on_output_grad, watch, arg))
        if v.grad_fn._sequence_nr() >= seq0:
            todo.append(v.grad_fn)
    seen: set[int] = set()
    while todo and len(seen) < _MAX_NODES:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        alive.append(node)
        hits = []
        for j, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            arg = edges.get((id(nxt), nr))
            if arg is None and leaves:
                var = getattr(nxt, "variable", None)
                if var is not None:
                    arg = leaves.get(id(var))
            if arg is not None:
                hits.append((j, arg))
            elif nxt._sequence_nr() >= seq0 and nxt.next_functions:
                todo.append(nxt)
        if hits:
            node.register_hook(functools.partial(_on_node, watch, tuple(hits)))
            watch.pending_nodes += 1
    return watch
