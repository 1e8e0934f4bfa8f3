"""``torchparity.compile_backend``: a ``torch.compile`` backend that captures statistics inside the
compiled forward and backward graphs and writes them as a torchparity dump (docs/compile.md)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import UsageError
from ..capture.compiled import eager_hook
from ..capture.session import StatRows
from ..capture.stat_batch import RowRef, StatBatcher
from .instrument import Instrumented, instrument
from .records import NodeRecord
from .stats_op import collecting
from .writer import CompiledDump

_MODES = ("statistics",)
#: modes of a capture inside torchparity.dump (compile/in_dump.py): values handed out for md5/tensor
_DUMP_MODES = ("statistics", "md5", "tensor")
_INNERS = ("inductor", "eager")


def _no_compile_caches() -> Any:
    import contextlib

    stack = contextlib.ExitStack()
    try:
        import torch._functorch.config as fconf

        if hasattr(fconf, "enable_autograd_cache"):
            stack.enter_context(fconf.patch(enable_autograd_cache=False))
    except ImportError:  # pragma: no cover - older torch
        pass
    import torch._inductor.config as iconf

    if hasattr(iconf, "fx_graph_cache"):
        stack.enter_context(iconf.patch(fx_graph_cache=False))
    return stack


def _inductor_patch(config: dict[str, Any]) -> Any:
    """The user's Inductor options (``torch.compile(mode=..., options=...)``) for our compile."""
    import contextlib

    if not config:
        return contextlib.nullcontext()
    import torch._inductor.config as iconf

    return iconf.patch(config)


def _drop_extra_output_strides(info: Instrumented) -> None:
    """Inductor reports the strides of every graph output to AOTAutograd, which slices the saved
    activations' strides from the end of that list: the statistics outputs must not be in it."""
    try:
        from torch._guards import TracingContext

        tc = TracingContext.try_get()
    except ImportError:  # pragma: no cover - older torch
        return
    strides = getattr(tc, "output_strides", None) if tc is not None else None
    if strides is not None and info.n_outputs >= 0 and len(strides) > info.n_outputs:
        del strides[info.n_outputs:]


class _Wrapped:
    """A compiled graph whose extra (statistics) outputs are taken off and kept by the capture.

    Boxed calling convention (a list of inputs), as AOTAutograd calls its compilers' results;
    other attributes are those of the wrapped compiled graph."""

    def __init__(self, compiled: Callable[..., Any], info: Instrumented, capture: "CompileCapture") -> None:
        # an instance attribute: torch._dynamo.disable wraps the backward with functools.wraps,
        # which copies the instance __dict__ (a class attribute would be lost, and AOTAutograd
        # would call the wrapper unboxed with a warning)
        self._boxed_call = True
        self._compiled = compiled
        self._info = info
        self._capture = capture

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd calls forward graphs boxed (one list) and some backward paths unboxed;
        # graph inputs are tensors and symbols, never lists, so the two cannot be confused.
        boxed = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        shapes = self._info.concrete_shapes(boxed)  # before the call: a boxed callee frees its inputs
        cap = self._capture
        sink = cap.sink
        refs: list[Any] | None = None
        with contextlib.ExitStack() as stack:
            if cap.batcher is not None:  # statistics: accelerator values go to the capture's batcher
                refs = [None] * len(self._info.records)
                stack.enter_context(collecting(cap.batcher, refs, cpu_too=cap.device_stats is True))
            if sink is not None:  # inside torchparity.dump: its eager capture must not see the graph's own kernels
                stack.enter_context(sink.paused())
            outs = self._compiled(boxed)
        n = self._info.n_outputs
        single = n < 0
        extra = list(outs[1:] if single else outs[n:])
        if self._info.groups:  # blocks of [k, 6] rows, in record order
            rows: list[Any] = []
            for block, k in zip(extra, self._info.groups):
                slot = len(rows)
                # a batched value's row is its RowRef, not the op's unwritten row
                rows.extend(refs[slot + i] if refs is not None and refs[slot + i] is not None else block[i]
                            for i in range(k))
            extra = rows
        elif refs is not None:
            extra = [r if r is not None else e for r, e in zip(refs, extra)]
        cap._collect(self._info.records, extra, shapes)
        if single:  # the graph returned a single value
            return outs[0]
        return type(outs)(outs[:n]) if isinstance(outs, tuple) else list(outs[:n])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


class CompileCapture:
    """The backend object: pass it to ``torch.compile(model, backend=...)``.

    Statistics stay on the device as tensors until the step ends (:meth:`step`, an optimizer
    step when :meth:`attach` was called, or :meth:`close`); then they are read in one transfer and
    written as ``step{S}/rank{R}`` of ``output_dir``."""

    def __init__(self, output_dir: str | Path | None, *, mode: str = "statistics", inner: str = "inductor",
                 sink: Any = None, inductor_config: dict[str, Any] | None = None,
                 graph_pass: Callable[[torch.fx.GraphModule, str], None] | None = None,
                 summaries: str = "off", device_stats: bool | None = None) -> None:
        # ``sink`` (torchparity.dump's compiled-model bridge, compile/in_dump.py) takes each graph
        # run's records and extra outputs instead of this object's own dump
        if mode not in (_DUMP_MODES if sink is not None else _MODES):
            raise UsageError(f"compile_backend: mode={mode!r} is not supported inside compiled graphs yet; "
                             f"use mode='statistics' (md5/tensor modes: torchparity.dump(..., model=compiled_model, "
                             f"level='aten', mode=...))")
        if inner not in _INNERS:
            raise UsageError(f"compile_backend: inner={inner!r} is not a known inner compiler; use one of {', '.join(_INNERS)}")
        self.sink = sink
        self.inductor_config = dict(inductor_config or {})
        self.output_dir = Path(output_dir) if output_dir is not None else Path(".")
        if output_dir is not None and self.output_dir.exists() and not self.output_dir.is_dir():
            raise UsageError(f"compile_backend: output_dir {str(self.output_dir)!r} is a file, not a directory; "
                             f"pass a new or empty directory for the dump")
        from ..dump.summary_live import SUMMARY_WHEN

        if device_stats not in (None, True, False):
            raise UsageError(f"compile_backend: device_stats must be None (batch accelerator values), True or False "
                             f"(got {device_stats!r:.40})")
        if summaries not in SUMMARY_WHEN:
            raise UsageError(f"compile_backend: summaries must be one of {', '.join(SUMMARY_WHEN)} (got {summaries!r:.40})")
        if graph_pass is not None and not callable(graph_pass):
            raise UsageError(f"compile_backend: graph_pass must be a function (graph_module, phase) -> None, "
                             f"not {type(graph_pass).__name__}")
        self.mode = mode
        self.inner = inner
        self.graph_pass = graph_pass
        self.step_index = 0
        self._buffer: list[tuple[list[NodeRecord], list[torch.Tensor], Any]] = []
        self._skipped: dict[str, int] = {}
        self._random_ops = 0
        self._fallback_random: bool | None = None
        self._graphs = {"forward": 0, "backward": 0}
        self._hooks: list[Any] = []
        self.transfers = 0  # host transfers so far (one per device and dtype group per step)
        self._flushes_seen = 0
        self.records_per_step: list[int] = []
        self._dump = CompiledDump(self.output_dir, self.header, summaries) if sink is None else None
        #: statistics of accelerator values: batched (None, the default), of every value, CPU ones
        #: too (True: the counting bench and the tests), or per value on the device (False)
        self.device_stats = device_stats
        self.batcher: StatBatcher | None = StatBatcher() if mode == "statistics" and device_stats is not False else None

    # --- torch.compile backend -------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # forward seq_nr -> module, shared by the forward and backward graph of THIS compile only
        # (seq_nr restarts in every Dynamo graph: graph breaks and recompiles must not mix)
        fwd_modules: dict[int, tuple[str, str | None]] = {}
        if self.inner == "eager":
            from functorch.compile import make_boxed_func
            from torch._dynamo.backends.common import aot_autograd

            def compiler(phase: str) -> Callable[..., Any]:
                def run(g: torch.fx.GraphModule, ex: list[Any]) -> Any:
                    with self._paused():  # the backward compiles lazily, inside loss.backward()
                        info = self._instrument(g, ex, phase, fwd_modules)
                    return _Wrapped(make_boxed_func(g.forward), info, self)
                return run

            return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner_compile(g: torch.fx.GraphModule, ex: list[Any], **kwargs: Any) -> Any:
            with self._paused():  # the backward compiles lazily, inside loss.backward()
                info = self._instrument(g, ex, "backward" if kwargs.get("is_backward") else "forward", fwd_modules)
                compiled = compile_fx_inner(g, ex, **kwargs)
            _drop_extra_output_strides(info)
            return _Wrapped(compiled, info, self)

        # the AOTAutograd and FX graph caches would hand back a graph compiled without the
        # instrumentation (their keys do not include our inner compiler): off for this compile
        with _no_compile_caches(), _inductor_patch(self.inductor_config):
            return compile_fx(gm, example_inputs, inner_compile=inner_compile)

    def _paused(self) -> Any:
        """Inside torchparity.dump: its eager capture set aside (see compile/in_dump.py)."""
        import contextlib

        return self.sink.paused() if self.sink is not None else contextlib.nullcontext()

    def _instrument(self, gm: torch.fx.GraphModule, example_inputs: list[Any], phase: str,
                    fwd_modules: dict[int, tuple[str, str | None]]) -> Instrumented:
        if self.graph_pass is not None:  # a test-facing FX pass that changes the graph (a planted fault)
            self.graph_pass(gm, phase)
            gm.recompile()
        info = instrument(gm, example_inputs, phase, fwd_modules, values=self.mode != "statistics",
                          fuses=self.inner == "inductor",
                          batched=False if self.batcher is None else True if self.device_stats else "device")
        self._graphs[phase] += 1
        self._random_ops += info.random_ops
        if info.random_ops and self.inner == "inductor":
            import torch._inductor.config as inductor_config

            self._fallback_random = bool(getattr(inductor_config, "fallback_random", False)
                                         or self.inductor_config.get("fallback_random", False))
        for reason, n in info.skipped.items():
            self._skipped[reason] = self._skipped.get(reason, 0) + n
        return info

    def _collect(self, records: list[NodeRecord], stats: list[Any],
                 shapes: dict[int, tuple[list[int], list[int]]] | None = None) -> None:
        """Keep one graph run's statistics (device tensors or batcher rows; no host sync here)
        and, for records of symbolic size, this run's shapes."""
        stats = [s if isinstance(s, RowRef) else s.detach() for s in stats]
        if self.sink is not None:
            self.sink.collect(records, stats, shapes)
            return
        self._buffer.append((records, stats, shapes))

    def host_rows(self, items: list[Any]) -> Any:
        """The step's statistics for the writer: a float64 ``[n, 6]`` host tensor (one transfer per
        device and dtype), or, when batcher rows are among them, a
        :class:`~..capture.session.StatRows` (the batcher is flushed here: its transfers start;
        the writer thread waits for them)."""
        if any(isinstance(s, RowRef) for s in items):
            assert self.batcher is not None
            self.batcher.flush()
            self.transfers += self.batcher.flushes - self._flushes_seen
            self._flushes_seen = self.batcher.flushes
            return StatRows([s if isinstance(s, RowRef) else s.to("cpu", torch.float64).tolist() for s in items])
        host = torch.empty((len(items), 6), dtype=torch.float64)
        by_dev: dict[tuple[Any, Any], list[int]] = {}
        for i, s in enumerate(items):
            by_dev.setdefault((s.device, s.dtype), []).append(i)
        for idx in by_dev.values():
            rows = torch.stack([items[i] for i in idx]).to("cpu", torch.float64)
            self.transfers += 1
            if len(idx) == len(items):  # one device and dtype: the rows are the step's table
                host = rows
            else:
                host[torch.tensor(idx)] = rows
        return host

    # --- steps -------------------------------------------------------------------------------
    def attach(self, optimizer: torch.optim.Optimizer) -> "CompileCapture":
        """End a step after every ``optimizer.step()``."""
        self._hooks.append(optimizer.register_step_post_hook(eager_hook(lambda *_: self.step())))
        return self

    def step(self) -> int:
        """End the current step: read its statistics to the host (one transfer) and write them.
        Returns the number of records written."""
        buf, self._buffer = self._buffer, []
        if not buf:
            self.step_index += 1
            return 0
        host = self.host_rows([s for _, stats, _ in buf for s in stats])
        captured: list[NodeRecord] = []
        # the graph runs' record lists identify the step's records while no size is symbolic
        key = None if any(shapes for _, _, shapes in buf) else tuple(records for records, _, _ in buf)
        for records, _, shapes in buf:
            if not shapes:
                captured.extend(records)
                continue
            for j, rec in enumerate(records):
                if j in shapes:
                    rec = dataclasses.replace(rec, shape=shapes[j][0], stride=shapes[j][1])
                captured.append(rec)
        assert self._dump is not None  # a sink's capture is stepped by its dump
        n = self._dump.write_step(self.step_index, captured, host, key)
        self.records_per_step.append(n)
        self.step_index += 1
        return n

    def header(self) -> dict[str, Any]:
        """What the dump header says about the compiled capture (graphs, what was not captured)."""
        return {"backend": "torchparity.compile_backend", "inner": self.inner, "graphs": dict(self._graphs),
                "not_captured": dict(self._skipped),
                # random ops compiled by Inductor draw from its own generator unless fallback_random
                "random_ops": self._random_ops, "fallback_random": self._fallback_random}

    def close(self) -> None:
        """Write what is pending and remove the optimizer hooks."""
        if self._buffer:
            self.step()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._dump is not None:
            self._dump.close()

    def __enter__(self) -> "CompileCapture":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def compile_backend(output_dir: str | Path, *, mode: str = "statistics", inner: str = "inductor",
                    graph_pass: Callable[[torch.fx.GraphModule, str], None] | None = None,
                    summaries: str = "off", device_stats: bool | None = None) -> CompileCapture:
    """A ``torch.compile`` backend capturing statistics inside the compiled graphs::

        cap = torchparity.compile_backend("dumps/compiled")
        model = torch.compile(model, backend=cap)
        cap.attach(optimizer)       # a step per optimizer.step()
        ...
        cap.close()

    ``graph_pass(graph_module, phase)``, when given, runs on each AOTAutograd graph (``phase``
    ``"forward"``/``"backward"``) before the capture instruments it: it may change the graph in
    place (e.g. :func:`torchparity.compile.faults.scale_module_output`, a planted numeric fault
    for tests), and its changes are what runs and what is captured.

    ``summaries``: when the dump's Parquet summaries are written, as for :func:`torchparity.dump`:
    ``off`` (the default: not while training; the first ``torchparity query`` writes them),
    ``step`` (at each step's end, on the writer thread) or ``close``.

    ``device_stats``: the statistics of accelerator values are batched (None, the default: one
    copy kernel per value into a staging buffer, a constant number of kernels per flush, the rows
    read by the writer thread); ``True`` batches CPU values too (what the counting bench and the
    tests use to run the accelerator path here); ``False`` reduces each value on its device.
    """
    return CompileCapture(output_dir, mode=mode, inner=inner, graph_pass=graph_pass, summaries=summaries,
                          device_stats=device_stats)
