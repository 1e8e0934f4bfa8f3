"""``torchparity.NanInfTracker``: find the op that *created* a NaN/Inf, on the device, cheaply.

::

    with torchparity.NanInfTracker(model, on_failure="raise") as t:
        train(model)          # steps advance on optimizer.step(); t.step() by hand
    print(t.findings)        # [NanInfFinding(name='Aten.mul.7.forward', module='layers.1.mlp', ...)]

How it works: the tracker is a consumer of the op stream
(:func:`~torchparity.capture.op_stream.op_stream`, the process's one
:class:`~torch.utils._python_dispatch.TorchDispatchMode`), attached by :meth:`NanInfTracker.start`
with ``needs_modules`` and detached by :meth:`NanInfTracker.stop`. The stream works out once per op
what every consumer shares: the op's dump-style name (``Aten.mul.7.forward``: the same name a dump
or online compare running alongside gives the op), its phase, its module (forward: the innermost
running module; backward: the module whose forward created the autograd node), and step ends. A
step ends for every consumer at once (the first optimizer's ``step()``, or
:meth:`NanInfTracker.step`, which calls ``op_stream().next_step()``).


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
  that may corrupt any op's output, runs below the tracker, and no consumer of the stream's
  device layer, such as the emulated device, is attached). Under the same condition an output
  read whole by the next op through one that carries every NaN/Inf into its result (``add``,
  ``mul``, ``div``'s numerator, ``pow``, ``sum``, ``mean``, ``silu``, ``sqrt``: ``_PRESERVING``)
  is not screened itself: a finite result proves it finite; otherwise (or before anything else
  reads or writes it, or at the step end) it is screened and judged as usual, so the verdicts
  are those of screening every output (see :meth:`NanInfTracker._resolve`).
* Other devices: per op the host only appends to lists (which screens are the op's inputs, which
  its outputs, the op's name, module path and phase); at a step end the screens are stacked and folded *on the device* into two int64
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
under :class:`~torchparity.capture.session.tool_work` so other torchparity modes ignore them. It is
an observer (``layer = LAYER_OBSERVER``): a consumer of the stream's device layer (which computes
ops another way) runs inside it, so the tracker sees what the device computed, whichever was
attached first. A device that is a dispatch mode of its own must be entered *outside* the tracker.
The per-op checks live in :mod:`~torchparity.online.naninf_ops`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

import torch

from ..capture.compiled import eager_hook
from ..capture.module_tracker import Frame, ModuleTracker
from ..capture.op_stream import LAYER_OBSERVER, OpCall, OpConsumer, OpInfo, op_stream
from ..capture.outside_backward import OutsideBackward
from ..capture.schedule import check_schedule, tier_of
from ..capture.tensor_memo import TensorMemo
from ..errors import UsageError

log = logging.getLogger("torchparity")

__all__ = ["NanInfTracker", "NanInfFinding", "NonFiniteError"]

from .naninf_rules import (  # noqa: F401 (re-exported: tests and callers use naninf._screen ...)
    _META_KEY, _SKIP, _UNCHECKED, _ALIAS, _CHECK, _FINITE, _INF, _NAN, _SENTINEL, _OVERWRITING, _COPIES,
    _SCALED, _SMALL_ADDEND, _INHERITS, _SAME, _WIDTH, _FLOAT, _STRIDED, _CHUNK, _EXTERNAL, _PENDING,
    _PRESERVING, _INF_ORD, _screen, _host_fact, _OpInfo, _graph_task_id, _scales_down, _FMAX, _accumulates,
    _inherits_into, _scalars_in_range, _flat_tensors, _tensors,
)
from .naninf_findings import BEFORE_STEP, MARKER, NanInfFinding, NonFiniteError
from .naninf_fold import DeviceFold, _Pending
from .naninf_light import LightTier
from .naninf_rules import op_rules, other_modes
from .naninf_ops import OpChecks
from .naninf_screens import ScreenMemo
from .naninf_sites import SiteJudge

_STREAM = op_stream()


class NanInfTracker(OpChecks, SiteJudge, ScreenMemo, DeviceFold, LightTier, OpConsumer):
    """Report the first op that produced a NaN/Inf from finite inputs, with module path and step.

    :param model: optional root module, to name modules by their path in it (``layers.1.mlp``);
        without it the first module seen running is the root.
    :param on_failure: ``"log"`` (default: log a warning with the marker ``[torchparity:NANINF]``
        and keep going) or ``"raise"`` (also raise :class:`NonFiniteError` at the step boundary;
        ``"stop"`` is accepted as an alias).
    :param steps: steps tracked op by op (``None``: all). Other steps run untouched, or light.
    :param every: track op by op on steps 0, N, 2N, ... only (with ``steps``: the steps of the
        list that are multiples of N).
    :param light: ``"module"``: the steps not tracked op by op screen each module's output and
        the step's sinks (gradients, parameters) instead of nothing; a NaN/Inf that reaches a
        sink is reported (kind ``"light"``: the module or parameter, not the op) and the next step
        is tracked op by op (:mod:`~torchparity.online.naninf_light`).
    :param report_entered: also report, when no op created a NaN/Inf in a step, the first op that
        read a non-finite tensor from outside (data, parameters). Default on.

    ``findings`` lists every :class:`NanInfFinding` (the harmful creation sites of each step, in
    op order); ``absorbed`` the sites whose NaN/Inf reached no sink; ``first`` is the first
    culprit ever found. Steps advance with the op stream's: on ``optimizer.step()`` (the first
    optimizer that steps) or by hand with :meth:`step` (which ends the step of every consumer of
    the stream: a dump running alongside starts its next step too); :meth:`check` reads the
    current step's state now (one host sync). ``current_step`` counts the steps since this tracker
    started (the findings' ``step``).
    """

    #: how a refusal names this tool (a torch.compile'd model: capture/compiled.py)
    tool_name = "the NaN/Inf tracker"
    #: what a refusal offers instead: the dump of the compiled graphs counts NaN/Inf in every captured
    #: value, so it answers the tracker's first question in the compiled run itself (docs/compile.md)
    compiled_hint = ("to find the first NaN in the compiled run itself: torchparity.dump(DIR, "
                     "model=model, level='aten') (a compiled model, or one with compiled blocks), then torchparity "
                     "query DIR \"SELECT * FROM tensors WHERE io='output' AND nan > 0 ORDER BY step, record_id LIMIT 1\"")

    layer = LAYER_OBSERVER
    needs_modules = True
    #: compiled modules run compiled (torch >= 2.9): a NaN made inside one is told as entered, at its
    #: first tracked reader or at the module's output (a light step), with COMPILED_NOTE
    sees_compiled_modules = True
    #: end this tracker's step when the stream's step ends on ``optimizer.step()`` (False: only
    #: :meth:`step` does; op names still restart at every stream step)
    steps_on_optimizer = True

    def __init__(self, model: torch.nn.Module | None = None, *, on_failure: str = "log",
                 steps: Iterable[int] | None = None, report_entered: bool = True, every: int | None = None,
                 light: str | None = None) -> None:
        if on_failure == "stop":
            on_failure = "raise"
        if on_failure not in ("log", "raise"):
            raise UsageError(f"NanInfTracker: on_failure must be 'log' or 'raise' (got {on_failure!r})")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise UsageError(f"NanInfTracker: model must be a torch.nn.Module (got {type(model).__name__})")
        self.model = model
        self.on_failure = on_failure
        steps = check_schedule(steps, every, light, full="op-level tracking")
        self.steps = None if steps is None else frozenset(steps)
        self.every = every
        self.light = light
        self._escalate = False  # a light step saw a harmful NaN/Inf: the next step is tracked op by op
        self._outside: OutsideBackward | None = None  # pauses and resumes the stream outside backward
        self._paused = False
        self._light_reset()
        self.report_entered = report_entered
        self.findings: list[NanInfFinding] = []
        #: creation sites whose NaN/Inf never reached a sink (information, not findings)
        self.absorbed: list[NanInfFinding] = []
        self.current_step = 0
        self._attached = False
        self._tracker: ModuleTracker | None = None  # the op stream's, while attached
        self._hooks: list[Any] = []
        self._raise: NanInfFinding | None = None  # a step's finding to raise once the step has ended
        self._by_hand = False  # inside step(): the stream's step end is ours
        self._seen: tuple = ()  # the stream's consumer chain that ``_inherit`` was decided for
        self._call: OpCall | None = None  # the op being checked
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
    def running(self) -> bool:
        """Is the tracker attached to the op stream (between :meth:`start` and :meth:`stop`)?"""
        return self._attached

    @property
    def first(self) -> NanInfFinding | None:
        """The first op found creating a NaN/Inf (``kind == "created"``), if any."""
        for f in self.findings:
            if f.kind == "created":
                return f
        return None

    def start(self) -> "NanInfTracker":
        """Attach to the op stream (with ``model``, modules are named by their path in it)."""
        if self._attached:
            raise UsageError("this NanInfTracker is already running; call stop() first")
        import torch.optim.optimizer as optim_mod

        stream = op_stream()
        self._stale = True
        self._raise = None
        stream.attach(self, model=self.model)
        self._attached = True
        self._tracker = stream.tracker
        if self._tracker is not None:  # the root module's output is a sink
            self._tracker.on_exit.append(self._module_exit)
            self._tracker.on_enter.append(self._module_enter)
            if self.steps is not None or self.every is not None:
                self._outside = OutsideBackward(self._tracker)
                self._outside.run(self._follow_tier)
        # raise a step's finding only after the stream has ended the step for every consumer
        # (registered after the stream's own hook, so it runs after it)
        self._hooks = [optim_mod.register_optimizer_step_post_hook(eager_hook(self._after_opt_step))]
        self._seen = ()
        self._refresh_inherit(stream)
        return self

    def stop(self, _raise: bool = True) -> None:
        """Detach from the op stream; the last (partial) step is checked and reported."""
        if not self._attached:
            return
        op_stream().detach(self)  # -> on_detach
        pending, self._raise = self._raise, None
        finding = self._end_step(False, advance=False)
        self._clear_memo()
        if _raise:
            self._raise_if(pending or finding)

    def step(self) -> None:
        """End the current step by hand: check it (one host read), report, maybe raise. While the
        tracker runs this is ``op_stream().next_step()``: the step ends for every consumer."""
        if self._attached:
            self._by_hand = True
            try:
                op_stream().next_step()  # -> on_step_end
            finally:
                self._by_hand = False
            pending, self._raise = self._raise, None
        else:
            pending = self._end_step(False)
        self._raise_if(pending)

    def check(self) -> NanInfFinding | None:
        """Fold what the current step computed so far and return its finding (one host sync); on
        a light step, what its screens hold so far (module outputs, parameters as they are now)."""
        if self._tier == "light" and self._attached:
            with self._lock:
                found = self._light_collect(keep=True)
            return found[0] if found else None
        return self._read()

    def __enter__(self) -> "NanInfTracker":
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.stop(_raise=exc_type is None)

    # ---- the op stream -----------------------------------------------------------------------
    def on_step_end(self, step: int) -> None:
        """The stream ended a step: check it and report (raising waits until every consumer has
        seen the step end: :meth:`step`, or the optimizer hook after the stream's)."""
        if not self.steps_on_optimizer and not self._by_hand:
            return
        finding = self._end_step(False)
        if self._raise is None and finding is not None and finding.kind == "created":
            self._raise = finding  # the earliest step's culprit, if several steps end before a raise

    def on_detach(self) -> None:
        self._attached = False
        for h in self._hooks:
            h.remove()
        self._hooks = []
        t, self._tracker = self._tracker, None
        if t is not None and self._module_exit in t.on_exit:
            t.on_exit.remove(self._module_exit)
        if t is not None and self._module_enter in t.on_enter:
            t.on_enter.remove(self._module_enter)
        if self._outside is not None:
            self._outside.close()
            self._outside = None
        self._paused = False
        self._call = None

    def _after_opt_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pending, self._raise = self._raise, None
        self._raise_if(pending)

    def _raise_if(self, finding: NanInfFinding | None) -> None:
        if finding is not None and self.on_failure == "raise" and finding.kind == "created":
            raise NonFiniteError(finding)

    def _refresh_inherit(self, stream: Any) -> None:
        """CPU inheritance only while nothing below the tracker may change what ops compute."""
        self._seen = stream.consumers
        self._inherit = self._host_read and not other_modes()

    # ---- steps -------------------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._seq = 0  # tracked (checked) ops so far in this step
        # host-judged (CPU) ops: the first culprit (seq, name row, value) and first external reader
        self._host_entered: tuple[int, tuple] | None = None
        # creation sites of the step (seq, name row, value); bit i of a fact's mask (fact >> 2)
        # says "holds values created at site i"; _harm: sites whose values reached a sink
        self._sites: list[tuple[int, tuple, str]] = []
        self._harm = 0
        self._sunk = False  # a sink ran this step (backward, optimizer, the root module's exit)
        self._scaler_seen = False  # a GradScaler checked gradients this step (see SiteJudge._collect)
        self._lost = False  # a sink held NaN/Inf of no known site (then every site is harmful)
        self._wsites: dict[int, int] = {}  # storage ptr -> sites written into it in place
        # device path: storage ptr -> the screens of values copied into it in place, and the
        # screen of a tensor read after such a write -> (that screen, those screens): its
        # NaN/Inf may be theirs (lineage only; the reader still counts as reading an external)
        self._wscreens: dict[int, list[torch.Tensor]] = {}
        self._lin_alias: dict[int, tuple[torch.Tensor, list[torch.Tensor], bool]] = {}
        self._wtrunc: set[int] = set()  # storages written in place more often than remembered
        self._lineage_cut = False  # such a storage's NaN/Inf reached a sink (SiteJudge._device_lineage)
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
        # (device, dtype) -> [screen arena, slots used, queued values, first queued slot, their
        # stream key, their CUDA stream] (False: no batched reduction there): see _device_screen
        self._arenas: dict[tuple[torch.device, torch.dtype], Any] = {}
        self._queued_ptrs: set[int] = set()  # storages of the queued values
        self._queued_n = 0
        self._queued_bytes = 0
        self._tier = "full" if self._escalate else tier_of(self.current_step, self.steps, self.every, self.light)
        self._escalate = False
        self._active = self._tier == "full"
        self._light_reset()
        if self._attached:
            self._refresh_inherit(op_stream())
            if self._outside is not None:
                self._outside.run(self._follow_tier)

    def _clear_memo(self) -> None:
        self._memo.clear()
        self._gen.clear()
        self._stale = False

    def _end_step(self, raise_now: bool = False, advance: bool = True) -> NanInfFinding | None:
        """Check and report the step; returns its top finding (raised now with ``raise_now``,
        else by the caller once every consumer has seen the step end: :meth:`_raise_if`)."""
        with self._lock:
            if self._active:
                found, absorbed = self._collect()
            elif self._tier == "light":
                found, absorbed = self._light_collect(), []
                entered = bool(found) and found[0].name.endswith(BEFORE_STEP)
                if entered and self.findings:
                    found = []  # parameters that hold NaN/Inf are reported once
                # the op is not known: the next step is tracked op by op (unless the parameters
                # already held it: no op of the next step would create it either)
                self._escalate = bool(found) and not entered
            else:
                found, absorbed = [], []
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
        if raise_now:
            self._raise_if(finding)
        return finding

    # ---- module attribution ------------------------------------------------------------------
    def _module_exit(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        """The root module's output is a sink (see :meth:`_verdict`); the stream's tracker tags
        the autograd nodes for backward attribution."""
        if not self._attached:
            return
        if self._active:
            if frame.path == "" and not frame.recompute:
                self._output_sink(output)
        elif self._tier == "light":
            self._light_exit(frame, output)

    def _module_enter(self, frame: Frame, args: tuple, kwargs: dict) -> None:
        if self._tier == "light" and self._attached:
            self._light_enter(frame)

    def _row(self, info: _OpInfo, call: int) -> tuple:
        """(prefix, base, call, op, module, module class, phase) of the running op (its module
        and phase as the op stream names them)."""
        c = self._call
        module, module_class = c.where() if c is not None else ("", None)
        return (info.prefix, info.base, call, info.op, module, module_class, c.phase if c is not None else "forward")

    # ---- per op (hot path) -------------------------------------------------------------------
    def _op_info(self, si: OpInfo) -> _OpInfo:
        """The tracker's rules for an overload, keyed by the stream's :class:`OpInfo`."""
        info = op_rules(si)
        self._info[id(si)] = info
        self._funcs.append(si)  # keeps the id valid
        return info

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        """Check one op of the stream (see the module doc); ``run`` computes it."""
        if not self._active:
            self._stale = True  # writes in unchecked steps are not seen
            return run(*args, **kwargs)
        info = self._info.get(id(call.info))
        if info is None:
            info = self._op_info(call.info)
        if self._stale:
            self._clear_memo()
        if self._queued_n and (info.writes or info.foreign):
            self._flush_before(args, kwargs, info)
        if info.scaler_check:
            self._scaler_seen = True
        if _STREAM.consumers is not self._seen:  # a consumer came or went: inheritance still safe?
            self._refresh_inherit(_STREAM)
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
            out = run(*args, **kwargs)
            if info.alias_src == 0 and isinstance(out, torch.Tensor) and args:  # detach, alias: same values
                e = self._memo.get(args[0])
                if e is not None and self._current(args[0], e):
                    self._memo[out] = e
                    if len(e) == 6:  # deferred: resolved with its source
                        self._pend[id(out)] = (out, e[5])
            return out
        if info.collective:
            # an asynchronous collective (DDP's bucket all-reduce, async_op=True) fills its outputs
            # when it is waited for, after it returned: they are not screened here (they would read
            # the values before the reduction) but by their first reader, as values from outside
            # (a NaN another rank made is "entered", never blamed on this rank's next op)
            out = run(*args, **kwargs)
            if info.writes:
                self._note_writes(args, kwargs, info.writes)
            return out
        self._call = call
        phase = call.phase
        if phase != "forward":
            self._sunk = True
        n = call.index
        if kind == _UNCHECKED:
            out = run(*args, **kwargs)
            if info.writes:
                self._note_writes(args, kwargs, info.writes)
            return out
        if info.alias_src >= 0 and len(args) > info.alias_src:
            src = args[info.alias_src]
            if isinstance(src, torch.Tensor) and src.dtype in _FLOAT and src.layout == _STRIDED:
                if not src.numel():
                    out = run(*args, **kwargs)
                    if info.writes:
                        self._note_writes(args, kwargs, info.writes)
                    return out
                return self._aliasing(run, args, kwargs, src, info, n)
        elif info.scaled >= 0 and self._inherit and self._host_read and args and isinstance(args[0], torch.Tensor) \
                and _scales_down(info.scaled, args, kwargs):
            src = args[0]
            if src.dtype in _FLOAT and src.layout == _STRIDED and src.is_cpu and src.numel():
                return self._aliasing(run, args, kwargs, src, info, n)
        return self._checked(run, args, kwargs, info, n, phase, extends)

