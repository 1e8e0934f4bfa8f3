"""``torchparity.NanInfTracker``: find the op that *created* a NaN/Inf, on the device, cheaply.

::

    with torchparity.NanInfTracker(model, on_failure="raise") as t:
        train(model)          # steps advance on optimizer.step(); t.step() by hand
    print(t.findings)        # [NanInfFinding(name='Aten.mul.7.forward', module='layers.1.mlp', ...)]

How it works (one :class:`~torch.utils._python_dispatch.TorchDispatchMode`):

* Every floating-point tensor an op reads or writes gets a *screen*: one small reduction computed
  on the tensor's own device (``sum`` in float32 or wider, which is non-finite exactly when the
  tensor holds a NaN/Inf or the sum itself overflows, see :func:`_screen`). What a screen said is
  remembered per tensor (a :class:`~torchparity.capture.session.TensorMemo` entry, valid while
  the tensor's version counter *and* the write generation of its storage are unchanged), so a
  tensor is measured once per value, across steps too: an input produced by a tracked op, or a
  parameter nobody wrote since, is not measured again. Every write the tracker sees (in-place,
  ``out=`` and ``_foreach_*_`` ops, from the ops' schemas) bumps its storage's generation, so a
  tensor changed in place is always measured again; a single-tensor write's version bump, which
  autograd makes only after the dispatch mode returns, is expected ahead.
* CPU tensors (where reading a scalar costs no synchronisation): the screen is read at once and
  each op is judged on the spot, and every creation site is kept with its lineage. Ops that
  cannot turn finite inputs into a NaN/Inf (``cat``, ``index_select``, ``where``, ``relu``,
  ``clamp``, ``amax`` ... see ``_INHERITS``) give their outputs "finite" without measuring them
  when every input is known finite (only while no other dispatch mode, e.g. an emulated device
  that may corrupt any op's output, runs below the tracker). Under the same condition an output
  read whole by the next op through one that carries every NaN/Inf into its result (``add``,
  ``mul``, ``div``'s numerator, ``pow``, ``sum``, ``mean``, ``silu``, ``sqrt``: ``_PRESERVING``)
  is not screened itself: a finite result proves it finite; otherwise (or before anything else
  reads or writes it, or at the step end) it is screened and judged as usual, so the verdicts
  are those of screening every output (see :meth:`NanInfTracker._resolve`).
* Other devices: per op the host only appends to lists (which screens are the op's inputs, which
  its outputs, the op's name, module path and phase); at a step boundary (``optimizer.step()`` or
  :meth:`NanInfTracker.step`) the screens are stacked and folded *on the device* into two int64
  scalars, "first culprit" (the first op whose outputs are non-finite while every input is finite)
  and "first external" (the first op that read a non-finite tensor that no tracked op produced in
  this step: NaN in the data or parameters), and those two numbers are the only values brought to
  the host, once per step. Nothing syncs per op.

Views, copies and multiplications by a scalar of magnitude <= 1 (divisions by >= 1) hand their
input's screen on (their result is non-finite exactly where their input is); they cannot be
culprits.

A creation site is judged from its tensor inputs and its scalar arguments: ``masked_fill(mask,
-inf)`` and ``full(..., -inf)`` are not sites (the -inf was asked for), ops reading such tensors
are propagators; a NaN scalar argument (``x * nan``, ``fill_(nan)``, ``x[i] = nan``) creates.
Every site of a step is kept; on the CPU each non-finite fact carries the mask of the sites whose
values it holds (``fact >> 2``), and only the sites that reach a sink (a backward or optimizer op,
a forward op outside any module, the root module's output) are findings; the others are
``absorbed`` (see :meth:`NanInfTracker._verdict` and :meth:`NanInfTracker._collect`).

The tracker never changes the model's numerics: it only reads tensors, and its own reductions run
under :class:`~torchparity.capture.session.tool_work` so other torchparity modes ignore them.
Device contexts (e.g. the emulated backend) must be entered *outside* the tracker so that the
tracker sees what the device computed.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture import ops as opinfo
from ..capture.aten_mode import _SKIP as _UNCOUNTED
from ..capture.module_tracker import Frame, ModuleTracker, tag_graph, where_now
from ..capture.session import TensorMemo, _tool_state
from ..errors import UsageError

log = logging.getLogger("torchparity")

__all__ = ["NanInfTracker", "NanInfFinding", "NonFiniteError"]

from .naninf_rules import (  # noqa: F401 (re-exported: tests and callers use naninf._screen ...)
    _META_KEY,
    _SKIP,
    _UNCHECKED,
    _ALIAS,
    _CHECK,
    _FINITE,
    _INF,
    _NAN,
    _SENTINEL,
    _OVERWRITING,
    _COPIES,
    _SCALED,
    _SMALL_ADDEND,
    _INHERITS,
    _SAME,
    _WIDTH,
    _FLOAT,
    _STRIDED,
    _CHUNK,
    _EXTERNAL,
    _PENDING,
    _PRESERVING,
    _INF_ORD,
    _screen,
    _host_fact,
    _OpInfo,
    _graph_task_id,
    _scales_down,
    _FMAX,
    _accumulates,
    _inherits_into,
    _scalars_in_range,
    _flat_tensors,
    _tensors,
)
from .naninf_findings import MARKER, NanInfFinding, NonFiniteError
from .naninf_fold import DeviceFold, _Pending
from .naninf_screens import ScreenMemo
from .naninf_sites import SiteJudge


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: "NanInfTracker") -> None:
        super().__init__()
        self.t = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.t._on_op(func, args, kwargs or {})


class NanInfTracker(SiteJudge, ScreenMemo, DeviceFold):
    """Report the first op that produced a NaN/Inf from finite inputs, with module path and step.

    :param model: optional root module, to name modules by their path in it (``layers.1.mlp``);
        without it the first module seen running is the root.
    :param on_failure: ``"log"`` (default: log a warning with the marker ``[torchparity:NANINF]``
        and keep going) or ``"raise"`` (also raise :class:`NonFiniteError` at the step boundary;
        ``"stop"`` is accepted as an alias).
    :param steps: steps to check (``None``: all). Other steps run untouched.
    :param report_entered: also report, when no op created a NaN/Inf in a step, the first op that
        read a non-finite tensor from outside (data, parameters). Default on.

    ``findings`` lists every :class:`NanInfFinding` (the harmful creation sites of each step, in
    op order); ``absorbed`` the sites whose NaN/Inf reached no sink; ``first`` is the first
    culprit ever found. Steps advance on ``optimizer.step()`` (the first optimizer that steps) or
    by hand with :meth:`step`; :meth:`check` reads the current step's state now (one host sync).
    """

    def __init__(self, model: torch.nn.Module | None = None, *, on_failure: str = "log",
                 steps: Iterable[int] | None = None, report_entered: bool = True) -> None:
        if on_failure == "stop":
            on_failure = "raise"
        if on_failure not in ("log", "raise"):
            raise UsageError(f"NanInfTracker: on_failure must be 'log' or 'raise' (got {on_failure!r})")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise UsageError(f"NanInfTracker: model must be a torch.nn.Module (got {type(model).__name__})")
        self.model = model
        self.on_failure = on_failure
        self.steps = None if steps is None else frozenset(int(s) for s in steps)
        self.report_entered = report_entered
        self.findings: list[NanInfFinding] = []
        #: creation sites whose NaN/Inf never reached a sink (information, not findings)
        self.absorbed: list[NanInfFinding] = []
        self.current_step = 0
        self._mode: _Mode | None = None
        self._tracker: ModuleTracker | None = None
        self._hooks: list[Any] = []
        self._first_optimizer: int | None = None
        self._in_optimizer = False
        self._lock = threading.RLock()
        self._info: dict[int, _OpInfo] = {}
        self._funcs: list[Any] = []
        # what screens said, per tensor: (version, storage ptr, write generation, fact
        # (_FINITE/_INF/_NAN, or the device 0-d screen), producer step or _EXTERNAL)
        self._memo = TensorMemo(limit=20_000)  # dead entries (and their device screens) swept early
        self._gen: dict[int, int] = {}  # storage ptr -> write generation (writes seen by the tracker)
        self._stale = True  # the memo may have missed writes: clear it before the next tracked op
        self._inherit = True  # no other dispatch mode below the tracker: CPU inheritance is safe
        #: read CPU screens at once (False: fold them like device screens; tests use it to run the
        #: device path on the CPU)
        self._host_read = True
        self._reset_step()

    # ---- public ------------------------------------------------------------------------------
    @property
    def first(self) -> NanInfFinding | None:
        """The first op found creating a NaN/Inf (``kind == "created"``), if any."""
        for f in self.findings:
            if f.kind == "created":
                return f
        return None

    def start(self) -> "NanInfTracker":
        if self._mode is not None:
            raise UsageError("this NanInfTracker is already running; call stop() first")
        import torch.optim.optimizer as optim_mod

        self._tracker = ModuleTracker()
        if self.model is not None:
            self._tracker.add_root(self.model)
        self._tracker.on_enter.append(self._module_enter)
        self._tracker.on_exit.append(self._module_exit)
        self._tracker.start()
        self._hooks = [optim_mod.register_optimizer_step_pre_hook(self._on_opt_pre),
                       optim_mod.register_optimizer_step_post_hook(self._on_opt_post)]
        self._stale = True
        self._inherit = self._host_read and not _other_modes()
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def stop(self, _raise: bool = True) -> None:
        """Stop tracking; the last (partial) step is checked and reported."""
        if self._mode is None:
            return
        try:
            self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if self._tracker is not None:
                self._tracker.stop()
                self._tracker = None
        self._end_step(raise_now=_raise, advance=False)
        self._clear_memo()

    def step(self) -> None:
        """End the current step by hand: check it (one host read), report, maybe raise."""
        self._end_step(raise_now=True)

    def check(self) -> NanInfFinding | None:
        """Fold what the current step computed so far and return its finding (one host sync)."""
        return self._read()

    def __enter__(self) -> "NanInfTracker":
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.stop(_raise=exc_type is None)

    # ---- steps -------------------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._counters: dict[tuple[str, str, str], int] = {}
        self._seq = 0  # tracked (checked) ops so far in this step
        # host-judged (CPU) ops: the first culprit (seq, name row, value) and first external reader
        self._host_entered: tuple[int, tuple] | None = None
        # creation sites of the step (seq, name row, value); bit i of a fact's mask (fact >> 2)
        # says "holds values created at site i"; _harm: sites whose values reached a sink
        self._sites: list[tuple[int, tuple, str]] = []
        self._harm = 0
        self._sunk = False  # a sink ran this step (backward, optimizer, the root module's exit)
        self._lost = False  # a sink held NaN/Inf of no known site (then every site is harmful)
        self._wsites: dict[int, int] = {}  # storage ptr -> sites written into it in place
        self._site_ix: dict[tuple, int] = {}
        self._dev_keys: list[torch.Tensor] = []  # device fold: every culprit key, per fold
        self._dev_outflags: list[torch.Tensor] = []  # device fold: "non-finite" per output screen
        self._lin: list[tuple] = []  # per device-judged op: (input screen ids, host mask, output ids, sink)
        self._dev_out: list[int] = []  # screen ids of the root module's outputs (device path)
        self._dev_keep: list[torch.Tensor] = []  # those screens, kept alive so that ids stay unique
        # CPU outputs whose screens wait for their consumer's (see _resolve)
        self._chain: list[list[Any]] = []
        self._pend: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (tensor, chain index)
        self._tail: set[int] = set()  # ids of the chain's last output and its same-size aliases
        # device-judged ops: one name row per op (with its seq), screens pending, folded state
        self._table: list[tuple[int, tuple]] = []
        self._folded = 0  # rows of _table already folded
        self._pending = _Pending()
        self._state: torch.Tensor | None = None  # device int64 [first culprit key, first external row]
        self._state_device: torch.device | None = None
        self._keep: list[torch.Tensor] = []  # pinned index tensors in flight to the device
        self._active = self.steps is None or self.current_step in self.steps
        if self._mode is not None:
            self._inherit = self._host_read and not _other_modes()
        if self._tracker is not None:
            self._tracker.new_step()

    def _clear_memo(self) -> None:
        self._memo.clear()
        self._gen.clear()
        self._stale = False

    def _end_step(self, raise_now: bool, advance: bool = True) -> None:
        with self._lock:
            found, absorbed = self._collect() if self._active else ([], [])
            if found and found[0].kind == "entered" and (
                    self.first is not None or any(f.kind == "entered" for f in self.findings)):
                found = []  # data/parameter NaN is reported once, and only before any culprit
            for f in found:
                self.findings.append(f)
                log.warning("%s %s", MARKER, f)
            for f in absorbed:
                self.absorbed.append(f)
                log.info("%s (absorbed, not a finding) %s", MARKER, f)
            finding = found[0] if found else None
            if advance:
                self.current_step += 1
            self._reset_step()
        if finding is not None and raise_now and self.on_failure == "raise" and finding.kind == "created":
            raise NonFiniteError(finding)

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = True

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = False
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        if id(optimizer) == self._first_optimizer:  # several optimizers: one step per iteration
            self.step()

    # ---- module attribution ------------------------------------------------------------------
    def _module_enter(self, frame: Frame, args: tuple, kwargs: dict) -> None:
        # the inputs' nodes themselves (ids of node wrappers are not stable on torch < 2.2)
        frame.stop_nodes = [a.grad_fn for a in args if isinstance(a, torch.Tensor) and a.grad_fn is not None]  # type: ignore[attr-defined]
        return None

    def _module_exit(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        """Tag the autograd nodes this module created (innermost module wins) for backward ops;
        the root module's output is a sink (see :meth:`_verdict`)."""
        if frame.path == "" and not frame.recompute and self._mode is not None and self._active:
            self._output_sink(output)
        if frame.recompute or not torch.is_grad_enabled():
            return
        tag_graph(output, (frame.path, frame.cls), stop_at=getattr(frame, "stop_nodes", None), key=_META_KEY)

    def _phase(self) -> str:
        """The running op's phase (as :func:`where_now` names it), without the module lookup."""
        if self._in_optimizer:
            return "optimizer"
        if _graph_task_id() != -1:
            frame = self._tracker.current() if self._tracker is not None else None
            return "recompute" if frame is not None and frame.recompute else "backward"
        return "forward"

    def _row(self, info: _OpInfo, call: int) -> tuple:
        """(prefix, base, call, op, module, module class, phase) of the running op."""
        phase, module, module_class = where_now(self._tracker, self._in_optimizer, _META_KEY)
        return (info.prefix, info.base, call, info.op, module, module_class, phase)

    # ---- per op (hot path) -------------------------------------------------------------------
    def _op_info(self, func: Any) -> _OpInfo:
        base = opinfo.base_name(func)
        ns = opinfo.namespace(func)
        prefix = "Distributed" if opinfo.is_collective(func) else "Aten"
        writes = opinfo.written_args(func)
        schema = getattr(func, "_schema", None)
        out_only: set[Any] = set()
        for i, name, _ in writes:
            if schema is not None and schema.arguments[i].kwarg_only:
                out_only.update((i, name))
        if base in _UNCOUNTED or ns == "profiler":
            kind = _SKIP
        elif opinfo.is_uninitialised(func):
            kind = _UNCHECKED
        else:
            kind = _CHECK
        # views and copies hand their input's values on and cannot create a NaN/Inf: their
        # outputs share the input's screen; uninitialised results mean nothing
        alias = 1 if base == "copy_" else 0 if (opinfo.is_view(func) or base in _COPIES or base in _SAME) else -1
        info = _OpInfo(kind=kind, prefix=prefix, base=base, op=str(func), first=1 if base in _OVERWRITING else 0,
                       out_only=frozenset(out_only), writes=writes, alias_src=alias,
                       scaled=_SCALED.get(base, -1) if ns == "aten" else -1,
                       inherits=base in _INHERITS and ns == "aten", view=opinfo.is_view(func))
        self._info[id(func)] = info
        self._funcs.append(func)  # keeps the id valid
        return info

    def _on_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not self._active:
            self._stale = True  # writes in unchecked steps are not seen
            return func(*args, **kwargs)
        if getattr(_tool_state, "busy", 0) > 0:
            return func(*args, **kwargs)
        info = self._info.get(id(func))  # OpOverload.__hash__ is Python code; overloads live forever
        if info is None:
            info = self._op_info(func)
        if self._stale:
            self._clear_memo()
        kind = info.kind
        extends = False
        if self._chain and kind != _SKIP:
            if info.writes:
                self._resolve()
            elif kind == _CHECK and info.alias_src < 0:
                if not (info.scaled >= 0 and self._inherit and args and isinstance(args[0], torch.Tensor)
                        and _scales_down(info.scaled, args, kwargs)):  # (exact scalings alias a deferred input)
                    extends = self._extends(info, args, kwargs)
                    if not extends:
                        self._resolve()
        if kind == _SKIP:
            out = func(*args, **kwargs)
            if info.alias_src == 0 and isinstance(out, torch.Tensor) and args:  # detach, alias: same values
                e = self._memo.get(args[0])
                if e is not None and self._current(args[0], e):
                    self._memo[out] = e
                    if len(e) == 6:  # deferred: resolved with its source
                        self._pend[id(out)] = (out, e[5])
            return out
        if self._in_optimizer:
            phase = "optimizer"
        elif _graph_task_id() != -1:
            phase = self._phase()
        else:
            phase = "forward"
        if phase != "forward":
            self._sunk = True
        key = (info.prefix, info.base, phase)
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        if kind == _UNCHECKED:
            out = func(*args, **kwargs)
            if info.writes:
                self._note_writes(args, kwargs, info.writes)
            return out
        if info.alias_src >= 0 and len(args) > info.alias_src:
            src = args[info.alias_src]
            if isinstance(src, torch.Tensor) and src.dtype in _FLOAT and src.layout == _STRIDED:
                if not src.numel():
                    out = func(*args, **kwargs)
                    if info.writes:
                        self._note_writes(args, kwargs, info.writes)
                    return out
                return self._aliasing(func, args, kwargs, src, info, n)
        elif info.scaled >= 0 and self._inherit and self._host_read and args and isinstance(args[0], torch.Tensor) \
                and _scales_down(info.scaled, args, kwargs):
            src = args[0]
            if src.dtype in _FLOAT and src.layout == _STRIDED and src.is_cpu and src.numel():
                return self._aliasing(func, args, kwargs, src, info, n)
        return self._checked(func, args, kwargs, info, n, phase, extends)

    def _aliasing(self, func: Any, args: tuple, kwargs: dict, src: torch.Tensor, info: _OpInfo, n: int) -> Any:
        """A view, copy or exact scaling: its outputs share the screen of ``src`` (no table entry;
        it cannot be a culprit). Narrowing casts (float32 -> float16 can overflow) are checked."""
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            hit = self._entry(src)
        finally:
            state.busy -= 1
        out = func(*args, **kwargs)
        state.busy += 1
        try:
            written = self._note_writes(args, kwargs, info.writes) if info.writes else ()
            for t in (out,) if isinstance(out, torch.Tensor) else _tensors(out):
                if t.dtype not in _FLOAT or t.layout != _STRIDED:
                    continue
                bump, ptr = 0, (hit[1] if info.view else None)
                for w, b, p in written:
                    if w is t:
                        bump, ptr = b, p
                if t.dtype == src.dtype or _WIDTH[t.dtype] > _WIDTH[src.dtype]:
                    if hit[3] is _PENDING and not written and t.is_cpu:
                        self._remember(t, hit[4], _PENDING, 0, ptr, k=hit[5])
                        if id(src) in self._tail and t.numel() == src.numel():
                            self._tail.add(id(t))
                    elif hit[3] is _PENDING:  # a write, or a copy to another device: judge first
                        self._resolve()
                        self._remember(t, hit[4], None, bump, ptr)
                    elif t.is_cpu == src.is_cpu or type(hit[3]) is int:
                        self._remember(t, hit[4], hit[3], bump, ptr)
                    else:  # a device screen for a CPU copy (or back): measured where it lives
                        self._remember(t, hit[4], None, bump, ptr)
                elif t.numel():  # a narrowing cast: may overflow, so it is measured
                    if hit[3] is _PENDING:
                        self._resolve()
                        hit = self._entry(src)
                    seq = self._seq
                    self._seq = seq + 1
                    self._judge(info, n, seq, [hit], 0, [self._remember(t, self.current_step, None, bump, ptr)],
                                [t], bool(written))
        finally:
            state.busy -= 1
        return out

    def _checked(self, func: Any, args: tuple, kwargs: dict, info: _OpInfo, n: int, phase: str = "forward",
                 extends: bool = False) -> Any:
        """An op that may create a NaN/Inf: screen its inputs (before it runs: in-place ops
        overwrite them) and outputs, and judge it."""
        seq = self._seq
        self._seq = seq + 1
        ins: list[tuple] = []
        in_ts: list[torch.Tensor] = []  # the tensors of ``ins``
        widest = -1  # widest float input (inheritance must not narrow)
        bad_scalar = 0  # _INF: an Inf scalar argument (asked for); _NAN: a NaN one (creates NaN)
        opaque = False  # a sparse/quantised float input: not screened, so nothing is inherited
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            first, out_only = info.first, info.out_only
            cands: list[torch.Tensor] = []  # tensor inputs (not out= destinations), lists flattened
            for i, a in enumerate(args):
                if i < first:
                    continue
                if isinstance(a, torch.Tensor):
                    if i not in out_only:
                        cands.append(a)
                elif isinstance(a, (list, tuple)):
                    cands.extend(x for x in a if isinstance(x, torch.Tensor))
                elif isinstance(a, float) and not math.isfinite(a):
                    bad_scalar = max(bad_scalar, _NAN if a != a else _INF)
            if kwargs:
                for k, a in kwargs.items():
                    if isinstance(a, torch.Tensor):
                        if k not in out_only:
                            cands.append(a)
                    elif isinstance(a, float) and not math.isfinite(a):
                        bad_scalar = max(bad_scalar, _NAN if a != a else _INF)
            for a in cands:
                if a.dtype in _FLOAT:
                    if a.layout != _STRIDED:
                        opaque = True
                    elif a.numel():
                        e = self._entry(a)
                        f = e[3]
                        if f and type(f) is int and f < 4 and e[4] == _EXTERNAL and a.numel() == 1 \
                                and not a.requires_grad:
                            # a constant (``x[i] = nan`` lifts a 0-d tensor): a scalar argument
                            bad_scalar = max(bad_scalar, f)
                            continue
                        ins.append(e)
                        in_ts.append(a)
                        if _WIDTH[a.dtype] > widest:
                            widest = _WIDTH[a.dtype]
        finally:
            state.busy -= 1
        out = func(*args, **kwargs)
        state.busy += 1
        try:
            written = self._note_writes(args, kwargs, info.writes) if info.writes else ()
            outs = [out] if isinstance(out, torch.Tensor) else _tensors(out)
            for w, _, _ in written:
                if not any(w is t for t in outs):
                    outs.append(w)
            if self._chain:
                fl = [t for t in outs if t.dtype in _FLOAT and t.layout == _STRIDED]
                if extends and len(fl) == 1 and fl[0].is_cpu and fl[0].numel() \
                        and all(e[3] is _PENDING or type(e[3]) is int for e in ins):
                    self._defer(fl[0], info, n, seq, phase, ins, bad_scalar)  # the chain grows
                    return out
                self._resolve()
                ins = [self._entry(a) if len(e) == 6 else e for e, a in zip(ins, in_ts)]
            elif self._inherit and not info.inherits and not info.writes and len(outs) == 1 and outs[0].is_cpu \
                    and outs[0].dtype in _FLOAT and outs[0].layout == _STRIDED and outs[0].numel() \
                    and all(type(e[3]) is int for e in ins):
                self._defer(outs[0], info, n, seq, phase, ins, bad_scalar)  # a chain starts
                return out
            # CPU, trusted kernels: an op that cannot create a NaN/Inf, with finite inputs and
            # in-range scalars, has finite outputs: nothing to measure
            known = info.inherits and self._inherit and not bad_scalar and not opaque \
                and all(e[3] is _FINITE for e in ins) and _inherits_into(outs, widest) \
                and _scalars_in_range(args, kwargs, outs) and not _accumulates(info.base, args, kwargs)
            producer = self.current_step
            res = []
            res_ts = []
            for t in outs:
                if t.dtype in _FLOAT and t.layout == _STRIDED and t.numel():
                    bump, ptr = 0, None
                    for w, b, p in written:
                        if w is t:
                            bump, ptr = b, p
                    res.append(self._remember(t, producer, _FINITE if known else None, bump, ptr))
                    res_ts.append(t)
            if not known:
                self._judge(info, n, seq, ins, bad_scalar, res, res_ts, bool(written))
        finally:
            state.busy -= 1
        return out

def _other_modes() -> bool:
    """Is another TorchDispatchMode active (one that may change what ops compute)?"""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return any(not isinstance(m, _Mode) for m in _get_current_dispatch_mode_stack())
    except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - be safe: no inheritance
        return True
