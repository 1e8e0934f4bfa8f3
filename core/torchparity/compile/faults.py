"""Planted numeric faults inside a compiled graph, for tests and demos of the compiled compare.

:func:`scale_module_output` makes a ``graph_pass`` for :func:`torchparity.compile_backend` that
multiplies the value of one eager op of one module (its first captured op in that module, in the
chosen phase) by a factor, inside the AOTAutograd graph, so that Inductor compiles the change
with the rest of the graph.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from .groups import JOIN, group_nodes
from .records import module_of


def scale_module_output(module: str, phase: str = "forward", factor: float = 1.05,
                        op: str | None = None) -> Callable[[torch.fx.GraphModule, str], None]:
    """A graph pass multiplying by ``factor`` the first op (``op``: only that aten op, e.g.
    ``"aten.addmm.default"``) of module ``module`` (eager path, ``layers.0.fc1``) in ``phase``.

    Backward graph nodes carry no module: an op there belongs to ``module`` when its autograd
    ``seq_nr`` is one of that module's forward nodes' (seen by the same pass in the forward
    graph, which is always compiled first)."""
    seqs: set[int] = set()

    def graph_pass(gm: torch.fx.GraphModule, graph_phase: str) -> None:
        groups = group_nodes(gm.graph)
        if graph_phase == "forward":
            seqs.update(g.meta_node.meta["seq_nr"] for g in groups
                        if module_of(g.meta_node.meta)[0] == module and g.meta_node.meta.get("seq_nr") is not None)
        if graph_phase != phase:
            return
        for g in groups:
            if op is not None and str(g.target) != op:
                continue
            meta = g.meta_node.meta
            if phase == "forward":
                mine = module_of(meta)[0] == module
            else:
                mine = not meta.get("nn_module_stack") and meta.get("seq_nr") in seqs
            if mine and g.out is not None:
                _scale(gm.graph, g.out, factor)
                return

    return graph_pass


def _scale(graph: torch.fx.Graph, node: torch.fx.Node, factor: float) -> None:
    users = list(node.users)
    with graph.inserting_after(node):
        new = graph.call_function(torch.ops.aten.mul.Tensor, (node, factor))
    new.meta["val"] = node.meta.get("val")  # same shape, dtype and fake mode
    new.meta[JOIN] = node  # captured as the op's value
    for u in users:
        u.replace_input_with(node, new)
