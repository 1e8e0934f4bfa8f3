"""``torchparity.NanInfTracker``: find the op that *created* a NaN/Inf, on the device, cheaply.

::

    with torchparity.NanInfTracker(model, on_failure="raise") as t:
        train(model)          # steps advance on optimizer.step(); t.step() by hand
    print(t.findings)        # [NanInfFinding(name='Aten.mul.7.forward', module='layers.1.mlp', ...)]

How it works (one :class:`~torch.utils._python_dispatch.TorchDispatchMode`):

* Every floating-point tensor an op reads or writes gets a *screen*: one small reduction computed
  on the tensor's own device (``sum`` in float32 or wider, which is non-finite exactly when the
  tensor holds a NaN/Inf or the sum itself overflows, see :func:`_screen`). Screens of op outputs
  are remembered per tensor (and tensor version), so an input produced by a tracked op is not
  measured again.
* Per op the host only appends indices to a table: which screens are its inputs, which its
  outputs, plus the op name (as the dump names it: ``Aten.mm.3.forward``), module path, phase.
* At a step boundary (``optimizer.step()`` or :meth:`NanInfTracker.step`) the screens are stacked
  and folded *on the device* into two int64 scalars, "first culprit" (the first op whose outputs
  are non-finite while every input is finite) and "first external" (the first op that read a
  non-finite tensor that no tracked op produced: NaN in the data or parameters), and those two
  numbers are the only values brought to the host, once per step. Nothing syncs per op.

A culprit is judged from its tensor inputs and its scalar arguments: ``masked_fill(mask, -inf)``
and ``full(..., -inf)`` are not culprits (the -inf was asked for), ops reading such tensors are
propagators. Only the first culprit per step is reported (everything after it is downstream).

The tracker never changes the model's numerics: it only reads tensors, and its own reductions run
under :class:`~torchparity.capture.session.tool_work` so other torchparity modes ignore them.
Device contexts (e.g. the emulated backend) must be entered *outside* the tracker so that the
tracker sees what the device computed.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture import ops as opinfo
from ..capture.aten_mode import _SKIP as _UNCOUNTED
from ..capture.module_tracker import Frame, ModuleTracker, tag_graph, where_now
from ..capture.session import _tool_state, tool_is_busy, tool_work
from ..errors import TorchparityError, UsageError

log = logging.getLogger("torchparity")

__all__ = ["NanInfTracker", "NanInfFinding", "NonFiniteError"]

#: ``grad_fn.metadata`` key for backward attribution (separate from the dump's key so that the
#: dump's own tags, which carry record ids, are never pre-empted by ours)
_META_KEY = "torchparity.naninf"
_SENTINEL = 1 << 62
#: greppable marker of every finding in the log
MARKER = "[torchparity:NANINF]"
#: in-place ops whose destination is overwritten without being read (its old content is no input)
_OVERWRITING = frozenset({"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_",
                          "geometric_", "cauchy_", "log_normal_", "copy_", "set_", "resize_", "_foreach_zero_",
                          "_foreach_copy_"})
#: ops that copy their first argument's values unchanged (or widened)
_COPIES = frozenset({"clone", "_unsafe_view", "_to_copy", "contiguous", "lift_fresh_copy", "alias_copy",
                     "detach_copy", "view_copy", "_reshape_alias_copy"})
_ref = weakref.ref
_FLOAT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: screens kept on the device before an intermediate fold (bounds memory on very long steps)
_CHUNK = 32768


class NonFiniteError(TorchparityError):
    """Raised at a step boundary when ``on_failure="raise"`` and an op created a NaN/Inf."""

    def __init__(self, finding: "NanInfFinding") -> None:
        super().__init__(str(finding))
        self.finding = finding


@dataclass
class NanInfFinding:
    """Where a NaN/Inf first appeared in a step.

    ``kind`` is ``"created"`` (the op turned finite inputs into a NaN/Inf: the culprit) or
    ``"entered"`` (no op created it in this step; the op read a non-finite tensor that no tracked
    op produced, e.g. a parameter or a batch that already held NaN).
    """

    kind: str
    name: str  # as the dump names the op: Aten.mul.7.forward
    op: str  # aten.mul.Tensor
    module: str  # module path ("" outside any module)
    module_class: str | None
    phase: str  # forward | backward | optimizer | recompute
    step: int
    seq: int  # index of the op among the tracked ops of the step
    value: str  # "NaN" or "Inf" (what the first bad screen held)

    def __str__(self) -> str:
        where = f"in module {self.module!r}" + (f" ({self.module_class})" if self.module_class else "") \
            if self.module else "outside any module"
        if self.kind == "created":
            what = f"produced {self.value} from finite inputs"
        else:
            what = f"read a tensor that already held {self.value} (no tracked op created it in this step)"
        return f"step {self.step}: {self.name} ({self.op}) {where}, {self.phase}: {what}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _screen(t: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor on ``t``'s device that is non-finite if ``t`` holds a NaN or an Inf.

    The sum is accumulated in float32 (float64 for float64 tensors): NaN and Inf propagate through
    it, and a sum of finite float32 values overflows only if they average above ~3e38/numel, i.e.
    values that are about to overflow anyway. It is the cheapest exact-enough reduction (one pass,
    vectorised, no temporary); ``isfinite(t).all()`` allocates a full bool tensor and is 10x
    slower on CPU, ``aminmax`` (exact) about 2x.
    """
    if t.dtype == torch.float16 or t.dtype == torch.bfloat16:
        return torch.sum(t, dtype=torch.float32)
    return torch.sum(t)


@dataclass
class _Pending:
    """Screens and index lists waiting for the next fold."""

    values: list[torch.Tensor] = field(default_factory=list)
    in_op: list[int] = field(default_factory=list)  # op seq of each tracked-input entry
    in_val: list[int] = field(default_factory=list)  # screen index of each tracked-input entry
    ext_op: list[int] = field(default_factory=list)  # same, for inputs no tracked op produced
    ext_val: list[int] = field(default_factory=list)
    out_op: list[int] = field(default_factory=list)
    out_val: list[int] = field(default_factory=list)
    bad_scalar_ops: list[int] = field(default_factory=list)  # ops with a NaN/Inf scalar argument


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: "NanInfTracker") -> None:
        super().__init__()
        self.t = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.t._on_op(func, args, kwargs or {})


class NanInfTracker:
    """Report the first op that produced a NaN/Inf from finite inputs, with module path and step.

    :param model: optional root module, to name modules by their path in it (``layers.1.mlp``);
        without it the first module seen running is the root.
    :param on_failure: ``"log"`` (default: log a warning with the marker ``[torchparity:NANINF]``
        and keep going) or ``"raise"`` (also raise :class:`NonFiniteError` at the step boundary;
        ``"stop"`` is accepted as an alias).
    :param steps: steps to check (``None``: all). Other steps run untouched.
    :param report_entered: also report, when no op created a NaN/Inf in a step, the first op that
        read a non-finite tensor from outside (data, parameters). Default on.

    ``findings`` lists every :class:`NanInfFinding` (at most one per step); ``first`` is the first
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
        self.current_step = 0
        self._mode: _Mode | None = None
        self._tracker: ModuleTracker | None = None
        self._hooks: list[Any] = []
        self._first_optimizer: int | None = None
        self._in_optimizer = False
        self._lock = threading.RLock()
        self._info: dict[Any, tuple[str, str, str, bool, bool, bool, int]] = {}
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
        # per checked op: (prefix, base, call, op, module, module class, phase); name = prefix.base.call.phase
        self._table: list[tuple[str, str, int, str, str, str | None, str]] = []
        self._counters: dict[tuple[str, str, str], int] = {}
        # id(tensor) -> (weakref, screen index, tensor version, external?); the weakref tells a
        # live tensor from a new one that reuses a freed id
        self._screens: dict[int, tuple[Any, int, int, bool]] = {}
        self._pending = _Pending()
        self._state: torch.Tensor | None = None  # device int64 [first culprit key, first external seq]
        self._state_device: torch.device | None = None
        self._keep: list[torch.Tensor] = []  # pinned index tensors in flight to the device
        self._active = self.steps is None or self.current_step in self.steps
        if self._tracker is not None:
            self._tracker.new_step()

    def _end_step(self, raise_now: bool, advance: bool = True) -> None:
        with self._lock:
            finding = self._read() if self._active else None
            if finding is not None and finding.kind == "entered" and (
                    self.first is not None or any(f.kind == "entered" for f in self.findings)):
                finding = None  # data/parameter NaN is reported once, and only before any culprit
            if finding is not None:
                self.findings.append(finding)
                log.warning("%s %s", MARKER, finding)
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
        """Tag the autograd nodes this module created (innermost module wins) for backward ops."""
        if frame.recompute or not torch.is_grad_enabled():
            return
        tag_graph(output, (frame.path, frame.cls), stop_at=getattr(frame, "stop_nodes", None), key=_META_KEY)

    def _where(self) -> tuple[str, str, str | None]:
        """(phase, module path, module class) of the running op."""
        return where_now(self._tracker, self._in_optimizer, _META_KEY)

    # ---- per op (hot path) -------------------------------------------------------------------
    def _op_info(self, func: Any) -> tuple[str, str, str, bool, bool, bool, int]:
        info = self._info.get(func)
        if info is None:
            base = opinfo.base_name(func)
            ns = opinfo.namespace(func)
            prefix = "Distributed" if opinfo.is_collective(func) else "Aten"
            uncounted = base in _UNCOUNTED or ns == "profiler"
            # views and copies hand their input's values on and cannot create a NaN/Inf: their
            # outputs share the input's screen; uninitialised results mean nothing
            alias = 1 if base == "copy_" else 0 if (opinfo.is_view(func) or base in _COPIES) else -1
            unchecked = opinfo.is_uninitialised(func) or uncounted
            info = (base, str(func), prefix, uncounted, unchecked, base in _OVERWRITING, alias)
            self._info[func] = info
        return info

    def _on_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not self._active or tool_is_busy():
            return func(*args, **kwargs)
        base, op, prefix, uncounted, unchecked, overwriting, alias = self._op_info(func)
        if uncounted:
            return func(*args, **kwargs)
        phase, module, module_class = self._where()
        key = (prefix, base, phase)
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        if unchecked:
            return func(*args, **kwargs)
        p = self._pending
        if alias >= 0 and len(args) > alias:
            src = args[alias]
            if type(src) is torch.Tensor or isinstance(src, torch.Tensor):
                if src.dtype in _FLOAT and src.layout == torch.strided:
                    return self._aliasing(func, args, kwargs, src, p)
        seq = len(self._table)
        self._table.append((prefix, base, n, op, module, module_class, phase))
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1  # tool_work(), inlined: this is the hot path
        try:
            first = 1 if overwriting else 0  # the overwritten destination is not an input
            for i, a in enumerate(args):
                if i < first:
                    continue
                if isinstance(a, torch.Tensor):
                    self._input(a, seq, p)
                elif isinstance(a, (list, tuple)):
                    for x in a:
                        if isinstance(x, torch.Tensor):
                            self._input(x, seq, p)
                elif isinstance(a, float) and not math.isfinite(a):
                    p.bad_scalar_ops.append(seq)
            if kwargs:
                for k, a in kwargs.items():
                    if isinstance(a, torch.Tensor):
                        if k != "out":
                            self._input(a, seq, p)
                    elif isinstance(a, float) and not math.isfinite(a):
                        p.bad_scalar_ops.append(seq)
        finally:
            state.busy -= 1
        out = func(*args, **kwargs)
        state.busy += 1
        try:
            screens = self._screens
            values = p.values
            for t in (out,) if isinstance(out, torch.Tensor) else _tensors(out):
                if t.dtype in _FLOAT and t.layout == torch.strided and t.numel():
                    idx = len(values)
                    values.append(_screen(t))
                    p.out_op.append(seq)
                    p.out_val.append(idx)
                    screens[id(t)] = (_ref(t), idx, t._version, False)
            if len(values) >= _CHUNK:
                self._fold()
        finally:
            state.busy -= 1
        return out

    def _lookup(self, t: torch.Tensor) -> tuple[Any, int, int, bool] | None:
        """The screen entry of ``t`` if it is current (same tensor object, same version)."""
        e = self._screens.get(id(t))
        if e is not None and e[0]() is t and e[2] == t._version:
            return e
        return None

    def _aliasing(self, func: Any, args: tuple, kwargs: dict, src: torch.Tensor, p: _Pending) -> Any:
        """A view or copy: its outputs share the screen of ``src`` (no op-table entry; it cannot
        be a culprit). Narrowing casts (float32 -> float16 can overflow) are checked normally."""
        hit = self._lookup(src)
        if hit is None:
            if not src.numel():
                return func(*args, **kwargs)
            with tool_work():
                hit = (_ref(src), len(p.values), src._version, True)
                p.values.append(_screen(src))
            self._screens[id(src)] = hit
        out = func(*args, **kwargs)
        for t in (out,) if isinstance(out, torch.Tensor) else _tensors(out):
            if t.dtype in _FLOAT and (t.dtype == src.dtype or t.element_size() > src.element_size()):
                self._screens[id(t)] = (_ref(t), hit[1], t._version, hit[3])
            elif t.dtype in _FLOAT and t.numel():  # a narrowing cast: may overflow, so it is measured
                self._narrowing(func, t, hit, p)
        return out

    def _narrowing(self, func: Any, t: torch.Tensor, hit: tuple[Any, int, int, bool], p: _Pending) -> None:
        base, op, prefix, *_ = self._op_info(func)
        phase, module, module_class = self._where()
        n = self._counters[(prefix, base, phase)] - 1
        seq = len(self._table)
        self._table.append((prefix, base, n, op, module, module_class, phase))
        (p.ext_op if hit[3] else p.in_op).append(seq)
        (p.ext_val if hit[3] else p.in_val).append(hit[1])
        with tool_work():
            idx = len(p.values)
            p.values.append(_screen(t))
        p.out_op.append(seq)
        p.out_val.append(idx)
        self._screens[id(t)] = (_ref(t), idx, t._version, False)

    def _input(self, a: torch.Tensor, seq: int, p: _Pending) -> None:
        if a.dtype not in _FLOAT or a.layout != torch.strided:
            return
        e = self._screens.get(id(a))
        if e is not None and e[0]() is a and e[2] == a._version:
            (p.ext_op if e[3] else p.in_op).append(seq)
            (p.ext_val if e[3] else p.in_val).append(e[1])
            return
        if not a.numel():
            return
        idx = len(p.values)
        p.values.append(_screen(a))
        p.ext_op.append(seq)
        p.ext_val.append(idx)
        self._screens[id(a)] = (_ref(a), idx, a._version, True)

    # ---- folding (device side) ---------------------------------------------------------------
    def _fold(self) -> None:
        """Reduce the pending screens into the device state (no host sync)."""
        p = self._pending
        self._pending = _Pending()
        self._screens = {}  # screen indices restart with the next chunk
        n_ops = len(self._table)
        if n_ops == 0 or not (p.out_op or p.in_op or p.ext_op or p.bad_scalar_ops):
            return  # only views/copies so far: nothing can have been created
        dev = self._state_device
        if dev is None:
            devs = {v.device for v in p.values}
            dev = next((d for d in devs if d.type != "cpu"), torch.device("cpu"))
            self._state_device = dev
        with tool_work():
            if p.values:
                vals = [v if v.device == dev else v.to(dev, non_blocking=True) for v in p.values]
                stacked = torch.stack(vals)  # type promotion: float32 screens, float64 if any
                nonfinite = ~torch.isfinite(stacked)
                isnan = torch.isnan(stacked)

            def idx(xs: list[int]) -> torch.Tensor:
                t = torch.tensor(xs, dtype=torch.long)
                if dev.type == "cpu":
                    return t
                try:  # pinned, so that the copy is asynchronous (no host sync)
                    t = t.pin_memory()
                except RuntimeError:
                    pass
                self._keep.append(t)
                return t.to(dev, non_blocking=True)

            zeros = torch.zeros(n_ops, dtype=torch.int32, device=dev)
            in_bad = zeros.clone()
            if p.in_op:
                in_bad.index_add_(0, idx(p.in_op), nonfinite[idx(p.in_val)].to(torch.int32))
            ext_bad = zeros.clone()
            if p.ext_op:
                ext_bad.index_add_(0, idx(p.ext_op), nonfinite[idx(p.ext_val)].to(torch.int32))
            if p.bad_scalar_ops:
                in_bad.index_fill_(0, idx(p.bad_scalar_ops), 1)
            out_bad = zeros.clone()
            out_nan = zeros
            if p.out_op:
                o_op, o_val = idx(p.out_op), idx(p.out_val)
                out_bad.index_add_(0, o_op, nonfinite[o_val].to(torch.int32))
                out_nan = zeros.clone().index_add_(0, o_op, isnan[o_val].to(torch.int32))
            seqs = torch.arange(n_ops, dtype=torch.long, device=dev)
            sentinel = torch.full((), _SENTINEL, dtype=torch.long, device=dev)
            culprit = (out_bad > 0) & (in_bad == 0) & (ext_bad == 0)
            # key = 2*seq + (0 if NaN else 1): the smallest key is the first culprit, its low bit the kind
            c_key = torch.where(culprit, seqs * 2 + (out_nan == 0).long(), sentinel).amin()
            e_key = torch.where(ext_bad > 0, seqs, sentinel).amin()
            new = torch.stack([c_key, e_key])
            self._state = new if self._state is None else torch.minimum(self._state, new)

    def _read(self) -> NanInfFinding | None:
        """Fold, bring the two state numbers to the host (the one sync of a step), judge."""
        with self._lock:
            self._fold()
            if self._state is None:
                return None
            c_key, e_key = (int(x) for x in self._state.tolist())
            self._keep.clear()
            if c_key < _SENTINEL:
                return self._finding("created", c_key // 2, "Inf" if c_key % 2 else "NaN")
            if e_key < _SENTINEL and self.report_entered:
                return self._finding("entered", e_key, "NaN/Inf")
            return None

    def _finding(self, kind: str, seq: int, value: str) -> NanInfFinding:
        prefix, base, call, op, module, module_class, phase = self._table[seq]
        return NanInfFinding(kind=kind, name=f"{prefix}.{base}.{call}.{phase}", op=op, module=module, module_class=module_class,
                             phase=phase, step=self.current_step, seq=seq, value=value)


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an op's output (a tensor, or a flat list/tuple of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res = []
        for x in out:
            if isinstance(x, torch.Tensor):
                res.append(x)
            elif isinstance(x, (list, tuple)):
                res.extend(y for y in x if isinstance(y, torch.Tensor))
        return res
    return []
