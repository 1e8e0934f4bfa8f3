"""``torchparity.dump(model=torch.compile(model), level="aten")``: the compiled graphs are captured
by :class:`~torchparity.compile.backend.CompileCapture` inside the dump (docs/compile.md).

Why the eager capture cannot simply watch a compiled module: the op stream's
``TorchDispatchMode`` on the mode stack makes Dynamo skip every frame ("non-infra torch dispatch
mode present", ``torch._dynamo.convert_frame``), so the module would run eagerly; the module
tracker's global forward hooks make Dynamo warn and trace the hooks. So, for the compiled call
only (and for the compiled forward/backward graphs' own runs, inside the autograd engine), the
stream's mode is popped and the global module hooks are set aside (:meth:`CompiledInDump.paused`);
the ops around it (loss, optimizer) are captured by the usual aten capture, in the same dump, with
the same step numbering and record ids in execution order.

The compiled module is recompiled with the capture as its backend, the user's own backend inside
it (``inductor`` with its options, ``aot_eager``, ``eager``); the user's numerics are unchanged.
Another backend is refused with one line (:func:`user_backend`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

from ..capture.batch import Batch
from ..capture.compiled import (CompiledModelError, allow_compiled, captured_compile, disallow_compiled,
                                quiet_compiled, restore_classes)
from ..capture.module_tracker import _META_KEY, class_name
from ..capture.op_stream import STREAM_KEY
from ..capture.ranks import current_rank
from ..records import op_record, tensor_entry  # noqa: F401 - tensor_entry used below
from .backend import CompileCapture
from .records import NodeRecord

#: backends whose compiler can be wrapped: the user's backend name -> our inner compiler
_WRAPPABLE = {"inductor": "inductor", "aot_eager": "eager", "eager": "eager"}
_HOOK_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called",
               "_global_forward_hooks_with_kwargs", "_global_backward_pre_hooks", "_global_backward_hooks")


def user_backend(model: Any, what: str) -> tuple[str, dict[str, Any]]:
    """(our inner compiler, Inductor options) for the backend ``model`` was compiled with;
    :class:`CompiledModelError` (one line) for a backend that cannot be wrapped."""
    b: Any = getattr(getattr(model, "dynamo_ctx", None), "callback", None)
    for _ in range(8):  # ConvertFrame -> ConvertFrameAssert -> WrapBackendDebug -> backend
        nxt = getattr(b, "_torchdynamo_orig_backend", None)
        if nxt is None or nxt is b:
            break
        b = nxt
    name = getattr(b, "compiler_name", None) or getattr(b, "__name__", None) or type(b).__name__
    if isinstance(getattr(b, "_compiler_name", None), str):
        name = b._compiler_name
    inner = _WRAPPABLE.get(str(name))
    if inner is None:
        raise CompiledModelError(
            f"{what} cannot capture a model compiled with backend {name!r}: only 'inductor', 'aot_eager' and "
            f"'eager' can be wrapped; compile with one of them, or dump at level='module', see docs/compile.md")
    config = getattr(b, "config", None) if inner == "inductor" else None
    return inner, dict(config) if isinstance(config, dict) else {}


def blocks_backend(blocks: list[tuple[str, Any]], what: str) -> tuple[str, dict[str, Any]]:
    """:func:`user_backend` of compiled modules captured together (a model's compiled blocks: one
    capture, so one inner compiler); :class:`CompiledModelError` (one line) when they differ."""
    inner, config = user_backend(blocks[0][1], what)
    for path, block in blocks[1:]:
        if user_backend(block, what) != (inner, config):
            raise CompiledModelError(
                f"{what} captures compiled blocks compiled alike: {path!r} was compiled with another backend "
                f"or other options than {blocks[0][0]!r}; compile them alike, or dump at level='module', "
                f"see docs/compile.md")
    return inner, config


def _is_ours(hook: Any) -> bool:
    """Is this global module hook torchparity's own (the module tracker's, the compiled-call guard)?"""
    f = getattr(hook, "func", hook)  # functools.partial
    f = getattr(f, "__func__", f)  # bound method
    return str(getattr(f, "__module__", "") or "").startswith("torchparity")


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a module's output (a tensor, or tuples/lists/dicts/dataclass-like outputs of them)."""
    from torch.utils._pytree import tree_flatten

    try:
        leaves = tree_flatten(out)[0]
    except Exception:  # an output type pytree cannot flatten
        leaves = list(out.values()) if isinstance(out, dict) else [out]
    if len(leaves) == 1 and not isinstance(leaves[0], torch.Tensor) and hasattr(leaves[0], "values"):
        try:  # a ModelOutput-like mapping
            leaves = list(leaves[0].values())
        except Exception:
            pass
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _compiled_node(fn: Any, depth: int = 3) -> Any:
    """The compiled graph's autograd node (AOTAutograd's ``CompiledFunctionBackward``) at or a
    few nodes behind ``fn`` (an output may be a view made after the graph); None if not found."""
    frontier = [fn]
    for _ in range(depth):
        nxt = []
        for f in frontier:
            if f is None:
                continue
            if "CompiledFunction" in type(f).__name__ or "CompiledFunction" in f.name():
                return f
            nxt.extend(g for g, _ in getattr(f, "next_functions", ()))
        frontier = nxt
    return None


def _block_class(blocks: list[tuple[str, Any]], path: str) -> str | None:
    """The class name of the compiled block at ``path`` (its records' class when the graph node has none)."""
    for p, b in blocks:
        if p == path:
            return type(getattr(b, "_orig_mod", b)).__name__
    return None


class CompiledInDump:
    """The compiled modules of one dump: a compiled model, or the compiled blocks of an eager model
    (:func:`~..capture.compiled.compiled_blocks`), recompiled with one capture, their records
    handed to the dump's session and writer (statistics computed in the graph; md5/tensor values
    as extra graph outputs, hashed / saved by the session's own code), one host transfer per step.

    Blocks of one class share one compiled graph (Dynamo traces parameters as inputs), so a
    graph's records carry module paths relative to the block; the block running it gives the
    prefix: its forward sets it, and its backward sets it again from a pre-hook on the block's
    compiled autograd node (:meth:`_forward`)."""

    def __init__(self, model: Any, session: Any, writer: Any, what: str,
                 blocks: list[tuple[str, Any]] | None = None) -> None:
        self.blocks = blocks if blocks is not None else [("", model)]
        inner, config = blocks_backend(self.blocks, what)
        self.model = model
        self.session = session
        self.writer = writer
        self.mode = session.options.mode
        # the dump's device_stats=True (CPU values through the accelerator path) holds in the graphs too
        self.capture = CompileCapture(None, mode=self.mode, inner=inner, sink=self, inductor_config=config,
                                      device_stats=True if session.options.device_stats else None)
        # built before the dump's global hooks exist: Dynamo then traces forward itself
        self._compiled = [torch.compile(block._orig_mod, backend=self.capture) for _, block in self.blocks]
        self._saved: list[Any] = []  # each block's own forward attribute (None: the class's)
        #: id(parameter) -> (module path, class) of the module that holds it (_tag_accumulations)
        self._owners: dict[int, tuple[str, str]] = {}
        for path, block in self.blocks:
            for name, mod in getattr(block, "_orig_mod", block).named_modules():
                full = ".".join(x for x in (path, name) if x)
                for p in mod.parameters(recurse=False):
                    self._owners.setdefault(id(p), (full, class_name(mod)))
        self._classes: list[tuple[Any, type]] = []  # quiet_compiled's, for restore_classes
        self._prefix = ""  # the module path of the block whose graph runs (collect)
        self._pending: list[tuple[list[Any], list[torch.Tensor]]] = []  # (OpRecords, device values)
        self._depth = 0
        self.records_per_step: list[int] = []
        self.transfers = 0  # host transfers (one per device and dtype group per step)

    # ---- lifecycle ----------------------------------------------------------------------------
    def install(self) -> None:
        for (path, block), compiled in zip(self.blocks, self._compiled):
            self._saved.append(block.__dict__.get("forward"))
            block.forward = functools.partial(self._forward, compiled, path)
            allow_compiled(block)
        self._classes = quiet_compiled(self.model)  # the model (compiled) or its compiled blocks

    def remove(self) -> None:
        restore_classes(self._classes)
        self._classes = []
        for (_, block), forward in zip(self.blocks, self._saved):
            disallow_compiled(block)
            if forward is not None:
                block.forward = forward
            else:
                block.__dict__.pop("forward", None)
        self._saved = []

    def _forward(self, compiled: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        tag = bool(path) and torch.is_grad_enabled()
        # the autograd nodes the block was handed (an output that is an input passed through keeps
        # its producer's node, maybe an earlier block's: not this block's backward)
        before = {id(n) for n in self._nodes((args, kwargs))} if tag else set()
        with self.paused(), captured_compile():
            prev, self._prefix = self._prefix, path
            try:
                out = compiled.forward(*args, **kwargs)
            finally:
                self._prefix = prev
        if torch.is_grad_enabled():  # (tag implies it)
            def set_prefix(*_: Any) -> None:  # the block's backward graph runs inside this node
                self._prefix = path

            for node in self._nodes(out):
                if id(node) not in before:
                    if tag:
                        node.register_prehook(set_prefix)
                    self._tag_accumulations(node)
        return out

    def _tag_accumulations(self, node: Any) -> None:
        """Name the gradient accumulations behind a compiled graph's autograd node by their
        parameter's module, as an eager run names them: the module tracker's walk that tags them
        in eager (at the module's exit) does not run inside the compiled call, so a second
        micro-batch's ``param.grad += g`` was recorded at the root module and never paired with
        eager's (the eager one was then judged alone: a false root cause on a CNN's conv bias)."""
        for fn, _ in getattr(node, "next_functions", ()):
            var = getattr(fn, "variable", None)  # AccumulateGrad's parameter
            owner = self._owners.get(id(var)) if var is not None else None
            if owner is not None:
                try:
                    meta = fn.metadata
                except (AttributeError, RuntimeError):
                    continue
                # the tags the dump's records (module_capture's) and the op stream's consumers read
                meta.setdefault(_META_KEY, {"module": owner[0], "module_class": owner[1], "fwd": None, "node": None})
                meta.setdefault(STREAM_KEY, owner)

    @staticmethod
    def _nodes(tree: Any) -> list[Any]:
        """The compiled autograd nodes (or, failing that, the nodes) behind the tensors of ``tree``."""
        out: dict[int, Any] = {}
        for t in _tensors(tree):
            if t.grad_fn is not None:
                node = _compiled_node(t.grad_fn) or t.grad_fn
                out.setdefault(id(node), node)
        return list(out.values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The op stream's dispatch mode off the mode stack and the global module hooks set aside
        (restored, in their order, on exit)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode_temporarily

        from ..capture.op_stream import is_stream_mode

        mm = torch.nn.modules.module
        saved = []
        for name in _HOOK_DICTS:
            d = getattr(mm, name, None)
            if d:
                full = dict(d)
                for k, f in full.items():
                    if _is_ours(f):  # the user's own global hooks stay (Dynamo handles them as without us)
                        del d[k]
                saved.append((d, full))
        self._depth = 1
        try:
            stack = _get_current_dispatch_mode_stack()
            if stack and is_stream_mode(stack[-1]):
                with _pop_mode_temporarily():
                    yield
            else:
                yield
        finally:
            self._depth = 0
            for d, full in saved:  # back in their order; hooks added meanwhile after them
                added = {k: f for k, f in d.items() if k not in full}
                d.clear()
                d.update(full)
                d.update(added)

    # ---- records ------------------------------------------------------------------------------
    def collect(self, records: list[NodeRecord], outs: list[torch.Tensor],
                shapes: dict[int, tuple[list[int], list[int]]] | None) -> None:
        """One graph run: allocate its records now (ids in execution order, the session's
        names and counters), keep its statistics / values on the device until the step ends."""
        s = self.session
        recs, vals = [], []
        prefix = self._prefix
        cls = _block_class(self.blocks, prefix) if prefix else None
        for j, (rec, out) in enumerate(zip(records, outs)):
            short = rec.op.split(".")[1] if rec.op.startswith(("aten.", "prims.")) else rec.op.split(".")[0]
            module = (f"{prefix}.{rec.module}" if rec.module else prefix) if prefix else rec.module
            if not s.wants(short, rec.op, rec.phase, module):
                continue
            flags = {"compiled": True, "node": rec.node, "node_id": rec.node_id, **rec.extra}
            if rec.source:
                flags["source"] = rec.source
            r = s.new_record(prefix="Aten", base=short, op=rec.op, level="aten", phase=rec.phase,
                             module=module, module_class=rec.module_class or cls, flags=flags)
            if r is None:
                continue
            shp, st = (shapes[j] if shapes and j in shapes else (rec.shape, rec.stride))
            r.tensors = [tensor_entry("output", "0", rec.dtype, shp, st, rec.device, False)]
            recs.append(r)
            vals.append(out)
        if recs:
            self._pending.append((recs, vals))

    def end_step(self) -> int:
        """Read the step's statistics (or values) to the host, one transfer per device and dtype,
        and hand the records to the dump. Returns the number of records."""
        pending, self._pending = self._pending, []
        recs = [r for rs, _ in pending for r in rs]
        vals = [v for _, vs in pending for v in vs]
        self.records_per_step.append(len(recs))
        if not recs:
            return 0
        s = self.session
        prev, s.busy = s.busy, True
        try:
            if self.mode == "statistics":  # batcher rows (flushed here) or one transfer per device and dtype
                before = self.capture.transfers
                rows = self.capture.host_rows(vals)
                self.transfers += self.capture.transfers - before
                s.flush()  # the eager records so far first
                slots = [r.tensors[0] for r in recs]
                self.writer.submit(Batch(s.step, current_rank(), recs, slots, rows))
            else:
                host = self._to_host(vals)
                s.flush()  # the eager records so far first
                for r, h in zip(recs, host):
                    e = r.tensors[0]
                    r.tensors = s.describe([("0", h)], "output", r.id, link=False)
                    r.tensors[0].stride = e.stride  # the graph value's stride, not the host copy's
                    s.commit(r)
                s.flush()
        finally:
            s.busy = prev
        return len(recs)

    def _to_host(self, vals: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each value on the host: one copy per (device, dtype) group."""
        groups: dict[tuple[Any, Any], list[int]] = {}
        for i, v in enumerate(vals):
            groups.setdefault((v.device, v.dtype), []).append(i)
        out: list[Any] = [None] * len(vals)
        for idx in groups.values():
            flat = torch.cat([vals[i].reshape(-1) for i in idx])
            host = flat.to("cpu") if flat.device.type != "cpu" else flat
            self.transfers += 1
            off = 0
            for i in idx:
                n = vals[i].numel()
                out[i] = host[off:off + n].view(vals[i].shape)
                off += n
        return out

    def header(self) -> dict[str, Any]:
        return self.capture.header()
