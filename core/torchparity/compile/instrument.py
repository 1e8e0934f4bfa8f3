"""The graph pass: add in-graph statistics of each floating call_function node's output.

Each instrumented node gets a ``[max, min, mean, norm, nan, inf]`` vector computed by nodes added
to the same graph (so Inductor can fuse the reductions into the kernels that produce the value);
the vectors are appended to the graph's outputs and taken off again by the wrapper in
:mod:`.backend` before the caller sees them. The added nodes only read the user's values.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .groups import group_nodes
from .records import NodeRecord, module_of, source_line, stable_id

aten = torch.ops.aten
prims = torch.ops.prims


@dataclass
class Instrumented:
    """What the pass did to one graph."""

    n_outputs: int  # outputs of the original graph (the extra ones follow)
    records: list[NodeRecord] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> node count
    # dynamic shapes: (input index, dim or None for a SymInt input, sympy symbol) bindings that
    # give the symbols' values from a run's inputs, and per record its symbolic shape and stride
    bindings: list[tuple[int, int | None, Any]] = field(default_factory=list)
    symbolic: dict[int, tuple[list[Any], list[Any]]] = field(default_factory=dict)
    random_ops: int = 0  # nodes drawing random numbers (dropout ...): see RANDOM_OPS
    #: the statistics come in blocks: extra output ``i`` is ``[groups[i], 6]``, the rows of the
    #: next ``groups[i]`` records (:func:`.stats_op.value_stats_many`); empty: one extra output
    #: per record (its statistics vector, or the value itself in md5/tensor modes)
    groups: list[int] = field(default_factory=list)

    def concrete_shapes(self, args: list[Any]) -> dict[int, tuple[list[int], list[int]]] | None:
        """Record index -> (shape, stride) of this run, for records with symbolic sizes."""
        if not self.symbolic:
            return None
        env = {}
        for i, dim, sym in self.bindings:
            a = args[i]
            env[sym] = int(a) if dim is None else int(a.shape[dim]) if dim >= 0 else int(a.stride()[-dim - 1])
        return {k: ([_eval(e, env) for e in shp], [_eval(e, env) for e in st]) for k, (shp, st) in self.symbolic.items()}


def _eval(e: Any, env: dict[Any, int]) -> int:
    if isinstance(e, int):
        return e
    try:
        return int(e.subs(env))
    except (TypeError, ValueError):  # a symbol not bound by the inputs
        return 0


def _dim(x: Any) -> Any:
    """An int, or the sympy expression of a symbolic size."""
    if isinstance(x, int):
        return x
    node = getattr(x, "node", None)
    expr = getattr(node, "expr", None)
    if expr is not None and getattr(expr, "is_number", False):
        return int(expr)
    return expr if expr is not None else int(x)


def _bindings(gm: torch.fx.GraphModule) -> list[tuple[int, int | None, Any]]:
    out: list[tuple[int, int | None, Any]] = []
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            e = _dim(v)
            if getattr(e, "is_Symbol", False):
                out.append((i, None, e))
        elif isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                e = _dim(size)
                if getattr(e, "is_Symbol", False):
                    out.append((i, d, e))
            for d, st in enumerate(v.stride()):
                e = _dim(st)
                if getattr(e, "is_Symbol", False):
                    out.append((i, -d - 1, e))
    return out


def _fake_mode(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)]) or detect_fake_mode(example_inputs)


def _is_view(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    if getattr(target, "is_view", False):
        return True
    if schema is None:
        return False
    return any(a.alias_info is not None and not a.alias_info.is_write for a in schema.returns)


#: ops Inductor runs as extern kernels: their inputs and outputs are always stored buffers
_EXTERN = frozenset({"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "convolution", "convolution_backward",
                     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_mm", "_int_mm"})
#: ops that draw random numbers; under Inductor they use its own generator (unless
#: ``torch._inductor.config.fallback_random``), so their values differ from an eager run's
RANDOM_OPS = frozenset({"native_dropout", "bernoulli", "bernoulli_", "rand", "randn", "rand_like", "randn_like",
                        "randint", "randint_like", "randperm", "normal", "uniform", "uniform_", "normal_",
                        "multinomial", "inductor_random", "inductor_seeds", "inductor_lookup_seed",
                        "philox_rand", "exponential", "exponential_"})
_FUSED_AWAY = ("value Inductor may keep in registers (capturing it would make it store the value: rounded in "
               "bf16/fp16, and the kernels around it fused differently)")


_MM = frozenset({"mm", "bmm", "addmm", "baddbmm"})
_ADD = frozenset({"add", "add_", "sub"})


def _fusable_matmul(node: torch.fx.Node) -> bool:
    """A matmul whose only reader is an add: Inductor's pattern matcher folds the pair into one
    ``addmm`` (one rounding) when the matmul has that single user; a second reader (ours) blocks
    it and the sum is rounded twice (HF BERT in bf16: the tied decoder/embedding weight's gradient
    changed)."""
    name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")
    if name not in _MM or len(node.users) != 1:
        return False
    (user,) = node.users
    return getattr(getattr(user.target, "_overloadpacket", None), "__name__", "") in _ADD


def _stored_anyway(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose value Inductor stores whatever else reads it: graph outputs and the inputs and
    outputs of extern kernels (matmuls, convolutions, fused attention), through views to their base.
    Reading such a value adds a kernel but cannot change how the graph's own values are rounded."""
    stored: set[torch.fx.Node] = set()

    def add(a: Any) -> None:
        while isinstance(a, torch.fx.Node) and a.op == "call_function" and _is_view(a.target) and a.args:
            a = a.args[0]
        if isinstance(a, torch.fx.Node):
            stored.add(a)

    for n in graph.nodes:
        if n.op == "output":
            torch.fx.node.map_arg(n.args, add)
        elif n.op == "call_function" and getattr(getattr(n.target, "_overloadpacket", None), "__name__", "") in _EXTERN:
            stored.add(n)
            # the outputs of a multi-output extern kernel (convolution_backward's gradients): each a
            # buffer it writes. Without them a CNN's convolution backward was never captured
            stored.update(u for u in n.users if u.target is operator.getitem)
            torch.fx.node.map_arg((n.args, n.kwargs), add)
    return stored


def _add(graph: torch.fx.Graph, mode: Any, target: Any, *args: Any) -> torch.fx.Node:
    """Add ``target(*args)`` to ``graph`` with its fake ``meta["val"]`` (Inductor needs it)."""
    node = graph.call_function(target, args)

    def val(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return a.meta["val"]
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    if mode is not None:
        with mode:
            node.meta["val"] = target(*val(args))
    else:
        node.meta["val"] = target(*val(args))
    return node


#: values per statistics node on the batched (accelerator) path, and their bytes at most: a node
#: runs once all its values are computed, so each value lives until the last of its group is
#: made (a few ops later), not until the graph's end
GROUP_VALUES = 32
GROUP_BYTES = 256 << 20


def _value_bytes(v: torch.fx.Node) -> int:
    """The value's bytes; for a symbolic size, the size it had when traced (its hint), else
    :data:`GROUP_BYTES` (a group of its own)."""
    val = v.meta["val"]
    n = val.numel()
    if not isinstance(n, int):
        hint = getattr(getattr(n, "node", None), "hint", None)
        try:
            n = int(hint) if hint is not None else None
        except (TypeError, ValueError):
            n = None
    return n * val.element_size() if n is not None else GROUP_BYTES


def _stats_nodes(graph: torch.fx.Graph, mode: Any, values: list[torch.fx.Node], batched: bool,
                 res: Instrumented) -> list[torch.fx.Node]:
    """The opaque :mod:`.stats_op` nodes of the captured values, in record order (see there why
    not the reductions as graph nodes). Measured on the host (a CPU graph): one ``value_stats``
    per value, put before the graph's output; Inductor schedules each where it sees fit (often
    right after its value, while it is in the cache; as one op reading every value at the end, a
    CPU step cost 1.28x instead of 1.17x).
    Batched (an accelerator's values go to the capture's batcher): one ``value_stats_many`` per
    group of consecutive values (:data:`GROUP_VALUES`, :data:`GROUP_BYTES`), put right after the
    group's last value: one op call and one kernel launch per dtype for the group, instead of one
    call and some 50 us of host time per value; ``res.groups`` gets the group sizes."""
    from .stats_op import value_stats_many_op, value_stats_op

    if not batched:
        with graph.inserting_before(next(n for n in reversed(graph.nodes) if n.op == "output")):
            return [_add(graph, mode, value_stats_op(), v, slot) for slot, v in enumerate(values)]
    position = {n: i for i, n in enumerate(graph.nodes)}
    out: list[torch.fx.Node] = []
    first, size = 0, 0
    for i, v in enumerate(values):
        size += _value_bytes(v)
        if i + 1 == len(values) or i + 1 - first >= GROUP_VALUES or size >= GROUP_BYTES:
            block = values[first:i + 1]
            with graph.inserting_after(max(block, key=position.__getitem__)):
                out.append(_add(graph, mode, value_stats_many_op(), block, first))
            res.groups.append(len(block))
            first, size = i + 1, 0
    return out


def _stats_as_graph_nodes(graph: torch.fx.Graph, mode: Any, v: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    """The statistics as ordinary graph nodes (fused by Inductor into the producing kernels, which
    can change their tiling: not used, kept for measurements)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    f = v if dtype == acc else _add(graph, mode, prims.convert_element_type.default, v, acc)
    mx = _add(graph, mode, aten.amax.default, f, [])
    mn = _add(graph, mode, aten.amin.default, f, [])
    mean = _add(graph, mode, aten.mean.default, f)
    sq = _add(graph, mode, aten.mul.Tensor, f, f)
    norm = _add(graph, mode, aten.sqrt.default, _add(graph, mode, aten.sum.default, sq))
    counts = []
    for test in (aten.isnan.default, aten.isinf.default):
        flags = _add(graph, mode, prims.convert_element_type.default, _add(graph, mode, test, v), acc)
        counts.append(_add(graph, mode, aten.sum.default, flags))
    # cat of unsqueezed scalars rather than aten.stack (Inductor lowers stack only by decomposition)
    parts = [_add(graph, mode, aten.unsqueeze.default, x, 0) for x in (mx, mn, mean, norm, *counts)]
    return _add(graph, mode, aten.cat.default, parts, 0)


def instrument(gm: torch.fx.GraphModule, example_inputs: Any, phase: str,
               fwd_modules: dict[int, tuple[str, str | None]], values: bool = False,
               fuses: bool = False, batched: Any = False) -> Instrumented:
    """Instrument ``gm`` in place. ``fwd_modules`` maps a forward node's ``seq_nr`` to its module
    (filled in the forward phase, read in the backward phase, whose nodes carry no module stack).
    With ``values`` (md5/tensor modes) the extra outputs are the captured values themselves
    instead of their statistics vectors. ``fuses``: the inner compiler fuses (Inductor). It keeps
    a chain of pointwise ops in registers (a bf16/fp16 chain in float32) and stores only some
    values; reading another would make it store that value (rounded, in bf16/fp16) for its other
    readers too and fuse the kernels around it differently. So only values it stores anyway
    (graph outputs, the inputs and outputs of extern kernels) are captured; the rest is listed as
    not captured. (Not even float32 values are safe to store: the C++ and Triton compilers contract
    a multiply-add into one FMA when the product stays in a register; stored, it is rounded first.
    An HF Llama's float32 gradients changed in the last bits when every value was captured.)
    ``batched``: the statistics of the graph's values go to a batcher (True), or only those of
    values not on the CPU ("device"): see :func:`_stats_nodes`."""
    graph = gm.graph
    mode = _fake_mode(gm, example_inputs)
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = out_node.args[0]
    single = not isinstance(outs, (list, tuple))
    outs = [outs] if single else list(outs)
    res = Instrumented(n_outputs=len(outs))
    counters: dict[tuple[str, str, str], int] = {}
    extra: list[torch.fx.Node] = []

    def skip(reason: str) -> None:
        res.skipped[reason] = res.skipped.get(reason, 0) + 1

    if phase == "forward":  # every forward node's module (views too: their backward is captured)
        for n in graph.nodes:
            if n.op == "call_function" and n.meta.get("seq_nr") is not None and n.meta.get("nn_module_stack"):
                fwd_modules.setdefault(n.meta["seq_nr"], module_of(n.meta))
    stored = _stored_anyway(graph) if fuses else None
    res.random_ops = sum(1 for n in graph.nodes if n.op == "call_function"
                         and getattr(getattr(n.target, "_overloadpacket", None), "__name__",
                                     getattr(n.target, "__name__", "")) in RANDOM_OPS)
    for group in group_nodes(graph):
        node, meta_node, target = group.out, group.meta_node, group.target
        if node is None:
            skip("op whose first output is not computed (a first layer's convolution backward: no input gradient)")
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            continue
        if _is_view(target):
            continue
        op = str(target)
        seq_nr = meta_node.meta.get("seq_nr")
        if phase == "backward":
            if meta_node.meta.get("nn_module_stack"):
                skip("forward node recomputed in the backward graph (its forward value is captured)")
                continue
            module, cls = fwd_modules.get(seq_nr, ("", None)) if seq_nr is not None else ("", None)
        else:
            module, cls = module_of(meta_node.meta)
            if seq_nr is not None:
                fwd_modules.setdefault(seq_nr, (module, cls))
        # the occurrence of this op in (phase, module) counts the values not captured too, so that
        # the compare can line the captured ones up with the eager ops (docs/compile.md)
        key = (phase, module, op)
        idx = counters.get(key, 0)
        counters[key] = idx + 1
        if stored is not None and node not in stored:
            skip(_FUSED_AWAY)
            continue
        if stored is not None and _fusable_matmul(node):
            skip("matmul Inductor may fold into the add that reads it (a second reader would block it)")
            continue
        numel = val.numel()
        if isinstance(numel, int) and numel == 0:
            skip("empty tensor")
            continue
        extra.append(node)
        shp, st = [_dim(x) for x in val.shape], [_dim(x) for x in val.stride()]
        if not all(isinstance(x, int) for x in shp + st):
            res.symbolic[len(res.records)] = (shp, st)
        res.records.append(NodeRecord(
            node=node.name, op=op, phase=phase, module=module, module_class=cls, call_index=idx,
            node_id=stable_id(module, phase, op, idx), source=source_line(meta_node.meta),
            dtype=str(val.dtype).replace("torch.", ""), shape=[x if isinstance(x, int) else 0 for x in shp],
            stride=[x if isinstance(x, int) else 0 for x in st], device=str(val.device),
            seq_nr=seq_nr, extra={"graph_nodes": group.size, "occurrence": idx}))
    for rec in res.records:  # how many there are in the graph: the compare closes each graph run with it
        rec.extra["occurrences"] = counters[(rec.phase, rec.module, rec.op)]
    if res.symbolic:
        res.bindings = _bindings(gm)
    if extra:
        if not values:  # statistics
            on_batcher = batched is True or (batched == "device" and any(
                v.meta["val"].device.type != "cpu" for v in extra))
            extra = _stats_nodes(graph, mode, extra, on_batcher, res)
        new = tuple(outs) + tuple(extra)
        out_node.args = (new,) if not single else (new,)
        res.n_outputs = len(outs) if not single else -1
        graph.lint()
        gm.recompile()
    return res
