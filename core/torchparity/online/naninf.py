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
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture import ops as opinfo
from ..capture.aten_mode import _SKIP as _UNCOUNTED
from ..capture.module_tracker import Frame, ModuleTracker, tag_graph, where_now
from ..capture.session import TensorMemo, _tool_state, tool_work
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
#: ops whose result is non-finite exactly where their first argument is, given a finite scalar
#: (``neg``: always; ``mul`` by ``|c| <= 1``; ``div`` by ``|c| >= 1``): they hand the screen on
_SCALED = {"neg": 0, "neg_": 0, "mul": 1, "mul_": 1, "div": 2, "div_": 2, "add": 3, "add_": 3, "sub": 3, "sub_": 3}
#: ``add``/``sub`` of a Python scalar below half an ulp of the dtype's largest value cannot
#: overflow (x + c rounds back to at most the largest finite value); bounds kept well inside
_SMALL_ADDEND = {torch.float16: 8.0, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e300}
#: ops that cannot turn finite inputs into a NaN/Inf: they select, move, compare or clip values
#: of their inputs (or fill in zeros/ones/their finite scalar arguments). Used on the CPU only
#: (trusted kernels), with every input known finite and every scalar in the output dtype's range.
_INHERITS = frozenset({
    "cat", "stack", "hstack", "vstack", "index_select", "embedding", "gather", "index", "_unsafe_index",
    "take", "masked_select", "where", "relu", "relu_", "threshold_backward", "abs", "abs_", "clamp", "clamp_",
    "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "hardtanh", "hardtanh_", "hardtanh_backward",
    "amax", "amin", "max", "min", "maximum", "minimum", "fmax", "fmin", "masked_fill", "masked_fill_",
    "masked_scatter", "masked_scatter_", "constant_pad_nd", "slice_backward", "select_backward",
    "index_put", "index_put_", "_index_put_impl_", "index_copy", "index_copy_", "index_fill", "index_fill_",
    "scatter", "scatter_", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    "flip", "roll", "repeat", "tril", "tril_", "triu", "triu_", "sort", "topk", "kthvalue", "narrow_copy",
    "diag", "diag_embed", "zeros", "ones", "zeros_like", "ones_like", "new_zeros", "new_ones", "zero_",
    "sign", "sgn", "ceil", "floor", "trunc", "frac", "sigmoid", "tanh", "relu6", "signbit",
    # bounded by their input (|silu(x)| <= |x|, |gelu(x)| <= |x|) or by 1 (softmax: exp(x - max) / sum >= 1)
    "silu", "silu_", "gelu", "gelu_", "hardswish", "hardswish_", "_softmax", "softmax",
})
#: uncounted ops whose output is their input (a new tensor object): the screen is handed on
_SAME = frozenset({"detach", "alias", "lift_fresh"})
#: float ranges: a cast to a dtype of higher rank (or the same) cannot overflow
_WIDTH = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
_FLOAT = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_STRIDED = torch.strided
#: screens kept on the device before an intermediate fold (bounds memory on very long steps)
_CHUNK = 32768
# op kinds
_SKIP, _UNCHECKED, _ALIAS, _CHECK = 0, 1, 2, 3
# host-side facts (CPU tensors): what the screen said; device tensors keep the 0-d screen itself
_FINITE, _INF, _NAN = 0, 1, 2
_EXTERNAL = -1  # producer step of a tensor no tracked op produced
#: fact of a CPU output whose screen is deferred (see NanInfTracker._resolve)
_PENDING = object()
#: elementwise ops and reductions whose result is non-finite wherever (one of) the listed
#: arguments is (IEEE: NaN and Inf propagate; inf*0, inf-inf give NaN): base -> argument positions
_PRESERVING = {"add": (0, 1), "sub": (0, 1), "mul": (0, 1), "div": (0,), "silu": (0,), "sqrt": (0,),
               "pow": (0,), "sum": (0,), "mean": (0,)}


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
    op produced, e.g. a parameter or a batch that already held NaN). ``"absorbed"`` (in
    :attr:`NanInfTracker.absorbed`, not a finding): a creation site whose NaN/Inf never reached
    the loss, a gradient, a parameter, optimizer state or the model's output.
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
        elif self.kind == "absorbed":
            what = f"produced {self.value} from finite inputs; absorbed (it reached no loss, gradient, " \
                "parameter or model output)"
        else:
            what = f"read a tensor that already held {self.value} (no tracked op created it in this step)"
        return f"step {self.step}: {self.name} ({self.op}) {where}, {self.phase}: {what}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_INF_ORD = float("inf")


def _screen(t: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor on ``t``'s device that is NaN if ``t`` holds a NaN, else Inf if it holds an
    Inf, else finite: ``max(|t|)`` (``vector_norm(t, inf)``, one reduction kernel, no temporary).

    Exact: it never overflows (the largest magnitude is a value ``t`` holds), so a tensor of
    finite values near the dtype's limit (a ``where(mask, 0, finfo.min)`` attention mask) is
    never reported. A ``sum`` overflowed to -inf on such masks.
    """
    return torch.linalg.vector_norm(t, _INF_ORD)


def _host_fact(t: torch.Tensor) -> int:
    """What a CPU tensor holds, read at once: ``_FINITE``, ``_INF`` or ``_NAN`` (exact).

    The fast screen is a float32 (float64) ``sum``, one vectorised pass; it is non-finite when
    ``t`` holds a NaN/Inf *or* when finite values sum past the dtype's range (masks filled with
    ``finfo.min``), so a non-finite sum is confirmed by looking at the values (rare: two more
    passes, only for such tensors).
    """
    if t.numel() == 1:
        s = t.item()
    else:
        s = (torch.sum(t, dtype=torch.float32) if t.dtype == torch.float16 or t.dtype == torch.bfloat16
             else torch.sum(t)).item()
        if s - s != 0:  # NaN/Inf in t, or an overflowing sum of finite values: look
            if bool(torch.isnan(t).any()):
                return _NAN
            return _INF if bool(torch.isinf(t).any()) else _FINITE
    if s - s == 0:
        return _FINITE
    return _NAN if s != s else _INF


@dataclass
class _Pending:
    """Device-side screens waiting for the next fold; ``*_op`` are indices into the device table."""

    in_op: list[int] = field(default_factory=list)  # op of each tracked-input screen
    in_val: list[torch.Tensor] = field(default_factory=list)
    ext_op: list[int] = field(default_factory=list)  # same, for inputs no tracked op produced
    ext_val: list[torch.Tensor] = field(default_factory=list)
    out_op: list[int] = field(default_factory=list)
    out_val: list[torch.Tensor] = field(default_factory=list)
    bad_in_ops: list[int] = field(default_factory=list)  # non-finite scalar argument or CPU input
    bad_ext_ops: list[int] = field(default_factory=list)  # non-finite external CPU input
    bad_out_ops: list[int] = field(default_factory=list)  # non-finite CPU output (Inf)
    nan_out_ops: list[int] = field(default_factory=list)  # NaN CPU output
    force_ops: list[int] = field(default_factory=list)  # a NaN scalar argument: a creation whatever the inputs

    def __len__(self) -> int:
        return len(self.in_val) + len(self.ext_val) + len(self.out_val)


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: "NanInfTracker") -> None:
        super().__init__()
        self.t = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.t._on_op(func, args, kwargs or {})


@dataclass(frozen=True)
class _OpInfo:
    """What the tracker needs to know about an op overload (computed once per overload)."""

    kind: int
    prefix: str  # Aten | Distributed
    base: str
    op: str
    first: int  # index of the first argument that is an input (1 when arg 0 is overwritten)
    out_only: frozenset  # positions and names of written arguments that are not inputs (out=)
    writes: tuple  # (position, name, is a list) of every written argument
    alias_src: int  # views/copies: position of the argument whose screen the outputs share (-1: none)
    scaled: int  # -1, or _SCALED's kind
    inherits: bool
    view: bool


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
        if frame.path == "" and not frame.recompute and self._mode is not None and self._active \
                and self._host_read:
            self._output_sink(output)
        if frame.recompute or not torch.is_grad_enabled():
            return
        tag_graph(output, (frame.path, frame.cls), stop_at=getattr(frame, "stop_nodes", None), key=_META_KEY)

    def _output_sink(self, output: Any) -> None:
        """The model's output is a sink: its NaN/Inf (and their sites) are harmful."""
        with self._lock:
            self._resolve()
            state = _tool_state
            state.busy = getattr(state, "busy", 0) + 1
            try:
                self._sunk = True
                for t in _flat_tensors(output):
                    if t.dtype in _FLOAT and t.layout == _STRIDED and t.numel() and t.is_cpu:
                        f = self._entry(t)[3]
                        if type(f) is int and f:
                            self._sink(f >> 2)
            finally:
                state.busy -= 1

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

    def _extends(self, info: _OpInfo, args: tuple, kwargs: dict) -> bool:
        """Does this op read the deferred chain's last output where a NaN/Inf always shows in
        its result (so that a finite result proves that output finite)?"""
        pos = _PRESERVING.get(info.base)
        if pos is None or (kwargs and any(k != "dtype" and k != "keepdim" and k != "dim"
                                                           for k in kwargs)):
            return False
        if info.base == "pow" and not (len(args) == 2 and type(args[1]) in (int, float) and args[1] > 0):
            return False
        tail = self._tail
        return any(i < len(args) and isinstance(args[i], torch.Tensor) and id(args[i]) in tail for i in pos)

    def _ctx(self, phase: str) -> tuple:
        """What names the running op later: (phase, module frame, autograd node)."""
        frame = self._tracker.current() if self._tracker is not None else None
        node = None
        if phase == "backward":
            try:
                node = torch._C._current_autograd_node()
            except (AttributeError, RuntimeError):
                node = None
        return (phase, frame, node)

    def _row_of(self, info: _OpInfo, n: int, ctx: tuple) -> tuple:
        """:meth:`_row` from a context captured by :meth:`_ctx` (as :func:`where_now` names it)."""
        phase, frame, node = ctx
        module, cls = (frame.path, frame.cls) if frame is not None else ("", None)
        if phase == "backward":
            try:
                tag = node.metadata.get(_META_KEY) if node is not None else None
            except (AttributeError, RuntimeError):
                tag = None
            module, cls = (tag[0], tag[1]) if tag else ("", None)
        return (info.prefix, info.base, n, info.op, module, cls, phase)

    def _resolve(self) -> None:
        """Judge the deferred chain: each link's output is non-finite only if the next link's is
        (it reads it through a preserving op), so one screen of the last output clears them all;
        otherwise every output is screened (none was written since) and judged in order."""
        chain = self._chain
        if not chain:
            return
        pend = self._pend
        self._chain, self._pend, self._tail = [], {}, set()
        state = _tool_state
        state.busy = getattr(state, "busy", 0) + 1
        try:
            last = _host_fact(chain[-1][0])
            facts = [_FINITE] * len(chain) if last == _FINITE else [_host_fact(link[0]) for link in chain[:-1]] + [last]
        finally:
            state.busy -= 1
        masks = [0] * len(chain)
        for k, (_, info, n, seq, bad_in, bad_ext, deps, ctx, mask, create) in enumerate(chain):
            for d in deps:
                if facts[d]:
                    bad_in = True
                    mask |= masks[d]
            if bad_ext and self._host_entered is None:
                self._host_entered = (seq, self._row_of(info, n, ctx))
            if facts[k]:
                row = self._row_of(info, n, ctx)
                masks[k] = self._verdict(seq, row, facts[k], bad_in or bad_ext, create, mask, ctx[0], ctx[1])
        memo = self._memo
        for t, k in pend.values():
            e = memo.get(t)
            if e is not None and e[3] is _PENDING:
                memo[t] = (e[0], e[1], e[2], facts[k] | (masks[k] << 2), e[4])

    def _verdict(self, seq: int, row: tuple, out_fact: int, bad: bool, create: bool, mask: int, phase: str,
                 frame: Any) -> int:
        """An op whose output holds NaN/Inf: a creation site (finite inputs, or a NaN scalar
        argument) or a propagator of the sites in ``mask``. Returns the output's site mask.

        Sinks (where a NaN/Inf is harmful): every op of the backward (gradients) and of the
        optimizer (parameters, state), and forward ops outside any module (the loss, the user's
        code); the root module's output is checked on its exit (:meth:`_module_exit`)."""
        if create or not bad:
            mask |= 1 << self._site(seq, row, "NaN" if out_fact & 3 == _NAN else "Inf")
        if phase != "forward" or frame is None:
            self._sink(mask)
        return mask

    def _site(self, seq: int, row: tuple, value: str) -> int:
        """Index of the creation site of ``row`` (one per op, module and phase in a step)."""
        key = (row[3], row[4], row[6])
        i = self._site_ix.get(key)
        if i is None:
            i = self._site_ix[key] = len(self._sites)
            self._sites.append((seq, row, value))
        return i

    def _sink(self, mask: int) -> None:
        """NaN/Inf of the sites in ``mask`` reached a sink (no site known: ``_lost``)."""
        self._sunk = True
        if mask:
            self._harm |= mask
        else:
            self._lost = True

    def _defer(self, t: torch.Tensor, info: _OpInfo, n: int, seq: int, phase: str, ins: list[tuple],
               bad_scalar: int) -> None:
        """Leave the screen of ``t`` (this op's only output, on the CPU) to its consumer."""
        step = self.current_step
        bad_in, bad_ext, deps, mask = bad_scalar == _INF, False, [], 0
        for e in ins:
            f = e[3]
            if f is _PENDING:
                deps.append(e[5])
            elif f:
                mask |= f >> 2
                if e[4] == step:
                    bad_in = True
                else:
                    bad_ext = True
        k = len(self._chain)
        self._chain.append([t, info, n, seq, bad_in, bad_ext, deps, self._ctx(phase), mask, bad_scalar == _NAN])
        self._remember(t, step, _PENDING, 0, k=k)
        self._tail = {id(t)}

    def _current(self, t: torch.Tensor, e: tuple) -> bool:
        """Does the memo entry ``e`` of ``t`` still describe its value?"""
        try:
            v = t._version
        except RuntimeError:  # inference tensors have no version counter
            v = None
        return e[0] == v and self._gen.get(e[1], 0) == e[2]

    def _entry(self, t: torch.Tensor) -> tuple:
        """``t``'s memo entry (version, storage ptr, write generation, fact, producer step) if
        current; else ``t`` is screened now (an input no tracked op produced since it changed)."""
        e = self._memo.get(t)
        if e is not None:
            try:
                v = t._version
            except RuntimeError:  # inference tensors have no version counter
                v = None
            if e[0] == v and self._gen.get(e[1], 0) == e[2]:
                return e
        b = t._base
        if b is not None and b.dtype == t.dtype:  # a view (autograd unpacks saved views anew)
            e = self._memo.get(b)
            if e is not None and e[3] is _FINITE and self._current(b, e):
                return self._remember(t, e[4], _FINITE, 0, e[1])  # part of a finite tensor
        e = self._remember(t, _EXTERNAL, None, 0)
        if self._wsites and type(e[3]) is int and e[3]:
            m = self._wsites.get(e[1])
            if m:  # a creation site wrote into this storage in place (``out[..., 3] = nan``)
                e = (e[0], e[1], e[2], e[3] | (m << 2), self.current_step)
                self._memo[t] = e
        return e

    def _remember(self, t: torch.Tensor, producer: int, fact: Any, bump: int, ptr: int | None = None,
                  k: int = -1) -> tuple:
        """Screen ``t`` (unless ``fact`` is given) and remember it. ``bump``: 1 for a tensor a
        single-tensor op just wrote (its version counter is bumped after the mode returns)."""
        if fact is None:
            fact = _host_fact(t) if t.is_cpu and self._host_read else _screen(t)
        try:
            v = t._version + bump
        except RuntimeError:
            v = None
        try:
            if ptr is None:
                ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage (subclasses): not remembered
            return (v, -1, -1, fact, producer)
        if fact is _PENDING:  # deferred: the chain index rides along
            e = (v, ptr, self._gen.get(ptr, 0), fact, producer, k)
            self._pend[id(t)] = (t, k)
        else:
            e = (v, ptr, self._gen.get(ptr, 0), fact, producer)
        self._memo[t] = e
        return e

    def _note_writes(self, args: tuple, kwargs: dict, writes: tuple) -> list[tuple[torch.Tensor, int, int]]:
        """Bump the write generation of every tensor the op wrote; returns (tensor, bump, ptr)."""
        gen = self._gen
        out = []
        for i, name, is_list in writes:
            v = args[i] if i < len(args) else kwargs.get(name)
            if v is None:
                continue
            for t in (v if is_list else (v,)):
                if isinstance(t, torch.Tensor):
                    try:
                        ptr = t.untyped_storage().data_ptr()
                    except (RuntimeError, NotImplementedError, TypeError):
                        continue
                    gen[ptr] = gen.get(ptr, 0) + 1
                    out.append((t, 0 if is_list else 1, ptr))
        return out

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

    def _judge(self, info: _OpInfo, n: int, seq: int, ins: list[tuple], bad_scalar: int, outs: list[tuple],
               out_ts: list[torch.Tensor] = (), writes: bool = False) -> None:  # type: ignore[assignment]
        """Creation site or propagator? On the host at once when every screen is a host fact
        (with the lineage of its NaN/Inf, see :meth:`_verdict`), else queued for the device fold."""
        if self._chain:
            self._resolve()
        step = self.current_step
        device = False
        bad_in = bad_scalar == _INF
        bad_ext = False
        in_mask = 0
        for e in ins:
            f = e[3]
            if type(f) is int:
                if f:
                    in_mask |= f >> 2
                    if e[4] == step:
                        bad_in = True
                    else:
                        bad_ext = True
            else:
                device = True
        out_fact = _FINITE
        for e in outs:
            f = e[3]
            if type(f) is int:
                if f & 3 > out_fact:
                    out_fact = f & 3
            else:
                device = True
        if not device:
            if bad_ext and self._host_entered is None:
                self._host_entered = (seq, self._row(info, n))
            if out_fact:
                row = self._row(info, n)
                frame = self._tracker.current() if self._tracker is not None else None
                mask = self._verdict(seq, row, out_fact, bad_in or bad_ext, bad_scalar == _NAN, in_mask, row[6], frame)
                memo = self._memo
                for t in out_ts:
                    e = memo.get(t)
                    if e is not None and type(e[3]) is int and e[3]:
                        memo[t] = (e[0], e[1], e[2], (e[3] & 3) | (mask << 2), e[4])
                        if writes and mask:
                            self._wsites[e[1]] = self._wsites.get(e[1], 0) | mask
            return
        j = len(self._table)
        self._table.append((seq, self._row(info, n)))
        p = self._pending
        if bad_scalar == _NAN:
            p.force_ops.append(j)
        if bad_in:
            p.bad_in_ops.append(j)
        if bad_ext:
            p.bad_ext_ops.append(j)
        if out_fact:
            (p.nan_out_ops if out_fact == _NAN else p.bad_out_ops).append(j)
        for e in ins:
            f = e[3]
            if type(f) is not int:
                if e[4] == step:
                    p.in_op.append(j)
                    p.in_val.append(f)
                else:
                    p.ext_op.append(j)
                    p.ext_val.append(f)
        for e in outs:
            f = e[3]
            if type(f) is not int:
                p.out_op.append(j)
                p.out_val.append(f)
                if self._state_device is None:
                    self._state_device = f.device
        if len(p) >= _CHUNK:
            self._fold()

    # ---- folding (device side) ---------------------------------------------------------------
    def _fold(self) -> None:
        """Reduce the pending screens into the device state (no host sync)."""
        p = self._pending
        self._pending = _Pending()
        start, end = self._folded, len(self._table)
        self._folded = end
        n_ops = end - start
        if n_ops == 0:
            return
        dev = self._state_device
        if dev is None:
            dev = next((v.device for v in p.in_val + p.ext_val if v.device.type != "cpu"), torch.device("cpu"))
            self._state_device = dev
        with tool_work():
            def idx(xs: list[int]) -> torch.Tensor:
                t = torch.tensor(xs, dtype=torch.long)
                if start:
                    t -= start
                if dev.type == "cpu":
                    return t
                try:  # pinned, so that the copy is asynchronous (no host sync)
                    t = t.pin_memory()
                except RuntimeError:
                    pass
                self._keep.append(t)
                return t.to(dev, non_blocking=True)

            def flags(ops: list[int], vals: list[torch.Tensor], test: Any) -> torch.Tensor:
                """Per op: how many of its screens in ``vals`` pass ``test``."""
                acc = torch.zeros(n_ops, dtype=torch.int32, device=dev)
                if ops:
                    stacked = torch.stack([v if v.device == dev else v.to(dev, non_blocking=True) for v in vals])
                    acc.index_add_(0, idx(ops), test(stacked).to(torch.int32))
                return acc

            def nonfinite(x: torch.Tensor) -> torch.Tensor:
                return ~torch.isfinite(x)

            in_bad = flags(p.in_op, p.in_val, nonfinite)
            ext_bad = flags(p.ext_op, p.ext_val, nonfinite)
            out_bad = flags(p.out_op, p.out_val, nonfinite)
            out_nan = flags(p.out_op, p.out_val, torch.isnan)
            for ops, acc in ((p.bad_in_ops, in_bad), (p.bad_ext_ops, ext_bad), (p.bad_out_ops, out_bad),
                             (p.nan_out_ops, out_bad), (p.nan_out_ops, out_nan)):
                if ops:
                    acc.index_fill_(0, idx(ops), 1)
            rows = torch.arange(start, end, dtype=torch.long, device=dev)
            sentinel = torch.full((), _SENTINEL, dtype=torch.long, device=dev)
            culprit = (out_bad > 0) & (in_bad == 0) & (ext_bad == 0)
            if p.force_ops:  # a NaN scalar argument created NaN whatever the inputs held
                forced = torch.zeros(n_ops, dtype=torch.bool, device=dev)
                forced.index_fill_(0, idx(p.force_ops), True)
                culprit = culprit | (forced & (out_bad > 0))
            # key = 2*row + (0 if NaN else 1): the smallest key is the first culprit, its low bit the kind
            keys = torch.where(culprit, rows * 2 + (out_nan == 0).long(), sentinel)
            self._dev_keys.append(keys)  # every culprit, read only when there is one
            c_key = keys.amin()
            e_key = torch.where(ext_bad > 0, rows, sentinel).amin()
            new = torch.stack([c_key, e_key])
            self._state = new if self._state is None else torch.minimum(self._state, new)

    def _read(self) -> NanInfFinding | None:
        """The current step's top finding so far (folds; one host sync)."""
        found = self._collect()[0]
        return found[0] if found else None

    def _collect(self) -> tuple[list[NanInfFinding], list[NanInfFinding]]:
        """Fold, bring the state to the host (the one sync of a step; a second one only when the
        device found creation sites), and sort the creation sites: (findings, absorbed).

        Findings: the sites whose NaN/Inf reached a sink, in op order; every site when no sink
        ran (plain functions, no module, no backward) or when a sink held a NaN/Inf of no known
        site. Absorbed: the other sites (their NaN/Inf was selected, clamped, cast or softmaxed
        away). Without sites, the first read of a non-finite tensor nobody created is "entered".
        """
        with self._lock:
            self._resolve()
            self._fold()
            sites = list(self._sites)
            harm = self._harm
            entered = self._host_entered
            if self._state is not None:
                c_key, e_key = (int(x) for x in self._state.tolist())
                self._keep.clear()
                if c_key < _SENTINEL:  # device-judged creation sites: no lineage, all harmful
                    for key in torch.cat(self._dev_keys).tolist():
                        if key < _SENTINEL:
                            seq, row = self._table[key // 2]
                            i = self._site(seq, row, "Inf" if key % 2 else "NaN")
                            harm |= 1 << i
                    sites = list(self._sites)
                self._dev_keys = []
                if e_key < _SENTINEL:
                    seq, row = self._table[e_key]
                    if entered is None or seq < entered[0]:
                        entered = (seq, row)
            if not self._sunk or (self._lost and entered is None):
                harm = (1 << len(sites)) - 1
            found = sorted((x for i, x in enumerate(sites) if harm >> i & 1), key=lambda x: x[0])
            absorbed = sorted((x for i, x in enumerate(sites) if not harm >> i & 1), key=lambda x: x[0])
            findings = [self._finding("created", *x) for x in found]
            if not findings and entered is not None and self.report_entered:
                findings = [self._finding("entered", entered[0], entered[1], "NaN/Inf")]
            return findings, [self._finding("absorbed", *x) for x in absorbed]

    def _finding(self, kind: str, seq: int, row: tuple, value: str) -> NanInfFinding:
        prefix, base, call, op, module, module_class, phase = row
        return NanInfFinding(kind=kind, name=f"{prefix}.{base}.{call}.{phase}", op=op, module=module, module_class=module_class,
                             phase=phase, step=self.current_step, seq=seq, value=value)


#: -1 unless autograd's engine is running a backward on this thread
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _other_modes() -> bool:
    """Is another TorchDispatchMode active (one that may change what ops compute)?"""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return any(not isinstance(m, _Mode) for m in _get_current_dispatch_mode_stack())
    except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - be safe: no inheritance
        return True


def _scales_down(kind: int, args: tuple, kwargs: dict) -> bool:
    """``neg``, ``mul`` by a finite Python scalar ``|c| <= 1``, ``div`` by ``|c| >= 1`` (no
    rounding mode), ``add``/``sub`` of a small ``c`` (no ``alpha``): the result is non-finite
    exactly where the input is."""
    if kind == 0:
        return len(args) == 1 and not kwargs
    if kind == 3:
        c = args[1] if len(args) == 2 and not kwargs else None
        if type(c) is not float and type(c) is not int:
            return False
        return -_SMALL_ADDEND.get(args[0].dtype, 0.0) <= c <= _SMALL_ADDEND.get(args[0].dtype, 0.0)
    if len(args) != 2 or (kwargs and set(kwargs) != {"rounding_mode"}):
        return False
    c = args[1]
    if type(c) is not float and type(c) is not int:
        return False
    if kind == 1:
        return -1.0 <= c <= 1.0
    return (c >= 1.0 or c <= -1.0) and not math.isinf(c) and kwargs.get("rounding_mode") is None


_FMAX: dict[torch.dtype, float] = {}


def _accumulates(base: str, args: tuple, kwargs: dict) -> bool:
    """``index_put(..., accumulate=True)`` and ``scatter(..., reduce=...)`` add values up: they
    can overflow, so they do not inherit."""
    if base in ("index_put", "index_put_", "_index_put_impl_"):
        return bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if base in ("scatter", "scatter_"):
        return any(type(a) is str for a in (*args, *kwargs.values()))
    return False


def _inherits_into(outs: list[torch.Tensor], widest: int) -> bool:
    """Inheritance needs CPU outputs (trusted kernels) no narrower than any float input (an
    ``index_put_`` of float32 values into float16 can overflow)."""
    for t in outs:
        if not t.is_cpu:
            return False
        w = _WIDTH.get(t.dtype)
        if w is not None and w < widest:
            return False
    return True


def _scalars_in_range(args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> bool:
    """Every Python float argument fits in the outputs' dtypes (else writing it overflows)."""
    lim = math.inf
    for t in outs:
        m = _FMAX.get(t.dtype)
        if m is None:
            m = _FMAX[t.dtype] = float(torch.finfo(t.dtype).max) if t.dtype.is_floating_point else math.inf
        lim = min(lim, m)
    for a in (*args, *kwargs.values()):
        if type(a) is float and not -lim <= a <= lim:
            return False
    return True


def _flat_tensors(x: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors in a module's output: a tensor, or nested lists/tuples/dicts (``ModelOutput``)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if depth > 4:
        return []
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y, depth + 1)]
    return []


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
