"""Group the nodes of a decomposed graph by the eager aten op they come from.

AOTAutograd records, on every node it traces, the aten op being traced when the node was made
(``node.meta["original_aten"]``) and the autograd sequence number of the eager call
(``node.meta["seq_nr"]``, shared by a forward op and its backward). Inductor's decompositions run
during that trace, so the ``var_mean``, ``rsqrt``, ``sub``, ``mul`` ... of a decomposed
``native_layer_norm`` all carry ``original_aten=aten.native_layer_norm.default`` and one
``seq_nr``. (Checked on torch 2.2 - 2.13; ``from_node`` names the Dynamo-level call, not the aten
op, and is absent in the backward graph, so it is not used.)

A group is captured once, as its source op; its value is the one the eager op would return
(output 0 of a multi-output op): the largest floating value of the group used outside it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


@dataclass
class NodeGroup:
    """The graph nodes of one eager op: ``out`` holds the op's value, ``target`` is the source op."""

    target: Any  # the eager aten op (OpOverload), or the node's own target when unknown
    #: the node whose value stands for the op's output 0; None for a multi-output op whose output 0
    #: is not computed (the first layer's ``convolution_backward``: no input gradient), which the
    #: graph pass counts as not captured
    out: torch.fx.Node | None
    meta_node: torch.fx.Node  # the node whose metadata (module, seq_nr, stack) describes the op
    size: int  # graph nodes in the group (getitem nodes included)


def _source(node: torch.fx.Node) -> Any:
    return node.meta.get("original_aten")


def _val_numel(node: torch.fx.Node) -> int | None:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or not v.dtype.is_floating_point:
        return None
    n = v.numel()
    return n if isinstance(n, int) else 1 << 62  # a symbolic size: a full-size value


def group_nodes(graph: torch.fx.Graph) -> list[NodeGroup]:
    """The groups of ``graph``'s call_function nodes, in the graph order of their output node.

    Nodes with the same (``original_aten``, ``seq_nr``) that are not themselves that op form one
    group (a decomposition; where the sequence number does not tell ops apart: consecutive nodes of
    one source op and module, see :data:`_UNSEQUENCED`); a node that is its source op (``addmm`` from ``addmm``) is a group
    of its own with its ``getitem`` nodes (two ``mm`` of one ``addmm`` backward stay two). Nodes
    with no provenance are groups of their own."""
    # sequence numbers that more than one (source op, module) of the forward side carries
    seen: dict[Any, set[tuple[str, Any]]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.meta.get("nn_module_stack") and _source(node) is not None:
            seen.setdefault(node.meta.get("seq_nr"), set()).add((str(_source(node)), _module_key(node)))
    shared = {seq for seq, owners in seen.items() if len(owners) > 1 or (isinstance(seq, int) and seq < 0)}
    members: dict[Any, list[torch.fx.Node]] = {}
    order: dict[torch.fx.Node, int] = {}
    keys: dict[torch.fx.Node, Any] = {}
    last: Any = None  # the previous node's key before its run number (nodes without a sequence number)
    runs = 0
    for i, node in enumerate(graph.nodes):
        order[node] = i
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0].op == "call_function":
            owner = node.args[0]
            key = keys.get(owner) or _key_of(owner, shared)
        else:
            key = base = _key_of(node, shared)
            if key[0] == _UNSEQUENCED:  # one op's decomposition is one run of consecutive nodes
                runs += base != last
                key = base + (runs,)
            last = base
        keys[node] = key
        members.setdefault(key, []).append(node)
    groups: list[NodeGroup] = []
    for key, nodes in members.items():
        inside = set(nodes)
        others: list[torch.fx.Node] = []  # a multi-output op's other outputs
        if key[0] == "self":
            head = key[1]
            outs = _escaping(nodes, inside)
            if isinstance(head.meta.get("val"), (list, tuple)):  # output 0 (or what a pass put after it)
                others = outs
                outs = [n for n in outs if (n.target is operator.getitem and n.args[1] == 0) or JOIN in n.meta]
            meta_node = head
            target = head.target
        else:
            outs = _escaping(nodes, inside)
            meta_node = next((n for n in nodes if n.meta.get("nn_module_stack")), nodes[-1])
            target = _source(nodes[0]) if _source(nodes[0]) is not None else _source(nodes[-1])
        best = None
        for n in outs:
            numel = _val_numel(n)
            if numel is None:
                continue
            if best is None or numel >= best[0]:
                best = (numel, n)
        if best is None:
            if any(_val_numel(n) is not None for n in others):  # no output 0 (see NodeGroup.out)
                groups.append(NodeGroup(target=target, out=None, meta_node=meta_node, size=len(nodes)))
            continue
        groups.append(NodeGroup(target=target, out=best[1], meta_node=meta_node, size=len(nodes)))
    groups.sort(key=lambda g: order[g.out if g.out is not None else g.meta_node])
    return groups


#: ``node.meta[JOIN] = other``: a node added by a graph pass (a planted fault) that belongs to the
#: group of ``other`` (its value becomes the op's value when it is used outside the group)
JOIN = "torchparity_group_of"


def _module_key(node: torch.fx.Node) -> Any:
    stack = node.meta.get("nn_module_stack")
    return next(reversed(stack)) if stack else None


def _key_of(node: torch.fx.Node, shared: set[Any] = frozenset()) -> tuple[Any, ...]:  # type: ignore[assignment]
    joined = node.meta.get(JOIN)
    if isinstance(joined, torch.fx.Node) and joined is not node:
        return _key_of(joined, shared)
    src, seq = _source(node), node.meta.get("seq_nr")
    if src is None or seq is None or str(src) == str(node.target):
        return ("self", node)
    if seq in shared and node.meta.get("nn_module_stack"):  # see _UNSEQUENCED
        return (_UNSEQUENCED, str(src), _module_key(node))
    # by name: the same op's OpOverload objects are not always one object (nor equal) in the meta
    return (str(src), seq)


#: the key of forward nodes whose autograd sequence number does not tell one eager op from
#: another: every node of an inference graph (traced under no_grad, ``seq_nr`` is -1 throughout,
#: or after a training step the last number used, for every node) and a forward graph's ops that
#: make no autograd node. They are grouped by source op and module, one group per run of
#: consecutive nodes. By (source op, sequence number) alone, every ``softmax`` of an HF Llama
#: evaluated under no_grad after training was one group, captured once with layer 0's module and
#: layer 1's value: a false root cause against eager
_UNSEQUENCED = "unsequenced"


def _escaping(nodes: list[torch.fx.Node], inside: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes of a group whose value is used outside it (or is a graph output)."""
    return [n for n in nodes if any(u not in inside for u in n.users)]
