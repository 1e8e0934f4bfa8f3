"""Aten-level capture: the dump's consumer of the op stream, recording every kernel call.

It sees what the Python API cannot: the kernels autograd runs in backward, the optimizer's
``_foreach_*`` kernels, factory ops and collectives (``c10d`` ops). Inputs are described before the
kernel runs (so in-place ops are recorded with their inputs as they were), outputs after.
Backward kernels are attributed to the module that created their autograd node (see
:func:`~torchparity.capture.module_tracker.tag_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable
from weakref import ref as _weakref

from torch import Tensor

from . import ops as opinfo
from .collectives import ASYNC_RESULTS, SYNC_COLLECTIVES, collective_flags
from .op_stream import LAYER_OBSERVER, UNCOUNTED_OPS, OpCall, OpConsumer, OpInfo, op_stream, written_tensors
from .optim_names import OptimizerParamNames
from .flatten import flat_args, flat_outputs
from .measure_reuse import view_version
from .session import CaptureSession
from .tool_state import _tool_state

# In-place ops that overwrite their destination without reading it: its old content is
# uninitialised memory more often than not, so it is described but not measured.
_OVERWRITING = frozenset({"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_",
                          "geometric_", "cauchy_", "log_normal_", "copy_", "set_", "resize_",
                          # torch.nn.init (API level)
                          "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_",
                          "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_"})
_OVERWRITTEN_INPUT = frozenset({"0", "self", "out"})
_OUT_ARG = frozenset({"out"})
# Factory ops whose result is uninitialised memory.
_UNINITIALIZED_RESULT = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                                   "empty_permuted"})
_ALL_OUTPUTS = frozenset({"0", "1", "2", "3"})

# Ops whose (single) output holds exactly the elements of input 0, so has the same statistics;
# True where the row-major order is kept too (same checksum, same saved values), False for transposes.
_SAME_VALUES = {"view": True, "_unsafe_view": True, "_reshape_alias": True, "reshape": True, "squeeze": True,
                "unsqueeze": True, "clone": True, "alias": True, "flatten": True, "view_as": True, "contiguous": True,
                "t": False, "transpose": False, "permute": False, "numpy_T": False, "matrix_H": False, "mT": False,
                "mH": False, "adjoint": False}

# Unrecorded ops (the stream's uncounted ops) whose output is its input under another tensor object
_ALIASES = frozenset({"detach", "alias"})

_WHY_OVERWRITTEN = "overwritten by the op"
_WHY_OUT = "out= buffer"
_WHY_UNINIT = "uninitialised memory"
_WHY_WORKSPACE = "kernel workspace"


@dataclass(frozen=True)
class _DumpInfo:
    """What the dump needs to know about one op overload beyond the stream's :class:`OpInfo`
    (computed once per overload)."""

    factory: bool  # result is uninitialised memory (empty*)
    in_no_values: dict[str, str]  # input arg -> why it is described but not measured
    out_no_values: dict[str, str]  # output index -> why
    flags: dict[str, Any]  # the record's constant flags (inplace, collective, view, random); copied per record


def _dump_info(info: OpInfo) -> _DumpInfo:
    func, base = info.func, info.base
    no_in = dict.fromkeys(_OVERWRITTEN_INPUT, _WHY_OVERWRITTEN) if base in _OVERWRITING else dict.fromkeys(_OUT_ARG, _WHY_OUT)
    no_in.update(dict.fromkeys(opinfo.workspace_inputs(func), _WHY_WORKSPACE))
    factory = base in _UNINITIALIZED_RESULT
    no_out = dict.fromkeys(_ALL_OUTPUTS, _WHY_UNINIT) if factory else {}
    no_out.update({str(i): _WHY_WORKSPACE for i in opinfo.workspace_outputs(func)})
    if info.collective and base not in SYNC_COLLECTIVES:  # distdump: results land when the Work completes
        no_out = ASYNC_RESULTS
    flags = {k: True for k, on in (("inplace", info.inplace), ("collective", info.collective), ("view", info.view),
                                   ("random", info.random)) if on}
    return _DumpInfo(factory, no_in, no_out, flags)


#: ops the dump does not record (bookkeeping, metadata queries): the stream's uncounted ops
_SKIP = UNCOUNTED_OPS


class AtenCaptureMode(OpConsumer):
    """Records aten kernels into a :class:`CaptureSession`: the dump's consumer of the
    :func:`~torchparity.capture.op_stream.op_stream` (an observer, so it records what any
    device-layer consumer, such as the emulated device, computed).

    ``with AtenCaptureMode(session):`` attaches it to the stream for the block. With
    ``collectives_only=True`` it records only collective ops (used at the module/api levels,
    where collectives are not visible otherwise) and passes every other op on.
    """

    layer = LAYER_OBSERVER
    needs_modules = False  # the session's own tracker names modules (shared with the api/module levels)

    def __init__(self, session: CaptureSession, collectives_only: bool = False) -> None:
        self.session = session
        self.collectives_only = collectives_only
        self._extra: dict[int, _DumpInfo] = {}  # id(overload) -> dump info (overloads live forever)
        # this consumer sees every kernel, so every write: the session may reuse statistics
        if not collectives_only:
            session.reuse_stats = True
        self._param_names = None if collectives_only else OptimizerParamNames(session.tracker)

    def __enter__(self) -> "AtenCaptureMode":
        if self._param_names is not None:
            self._param_names.start()
        try:
            op_stream().attach(self)
        except BaseException:
            if self._param_names is not None:
                self._param_names.stop()
            raise
        self._paused = False
        if not self.collectives_only:
            self.session.follow_tier(self._follow_tier)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.session.unfollow_tier(self._follow_tier)
            op_stream().detach(self)
        finally:
            if self._param_names is not None:
                self._param_names.stop()

    def _follow_tier(self) -> None:
        """A step began: between full steps (light or unscheduled steps of a scheduled dump, a
        rank not selected) this consumer needs no op, so it pauses the stream, whose mode then
        hands ops straight to their kernels when no other consumer needs them (those steps cost
        what a module-level dump costs, or nothing). Writes and allocations made meanwhile are
        not seen, so what was remembered is forgotten when it pauses (``session.forget``), and
        nothing is remembered until it resumes (as in a module-level dump). The schedule decides
        (``session.tier``); a façade pausing a full step (``enabled_step``) keeps every op seen.
        Called through ``session.follow_tier``: never inside a backward pass."""
        s = self.session
        full = s.tier == "full"  # the schedule's decision, not a façade's pause (enabled_step)
        if not full and not self._paused:
            self._paused = True
            s.forget()
            op_stream().pause(self)
        elif full and self._paused:
            self._paused = False
            s.reuse_stats = True
            op_stream().resume(self)

    def _run(self, run: Any, args: tuple, kwargs: dict, info: OpInfo) -> Any:
        """Run an unrecorded op; what it writes still invalidates statistics seen before, and
        what it allocates still counts for the uninitialised-memory bookkeeping."""
        out = run(*args, **kwargs)
        if not self.collectives_only:
            s = self.session
            if info.writes:
                s.note_writes(written_tensors(args, kwargs, info.writes))
            elif info.base in _ALIASES and args and s.reuse_stats and not s.busy:
                # detach/alias (unrecorded): the same values under another tensor object, e.g. a
                # parameter's .grad (AccumulateGrad detaches the incoming gradient), measured
                # already as the backward op's output
                s.same_values(args[0], out, True, view_version(args))
            if not s.busy:
                u = s.uninit
                if info.base in _UNINITIALIZED_RESULT:
                    u.mark(v for _, v in flat_outputs(out))
                elif u and not info.view:
                    u.written(v for _, v in flat_outputs(out))
        return out

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        s = self.session
        info = call.info
        if s._busy or not info.counted or not s.enabled_step or \
                (self.collectives_only and (not info.collective or s.api_collective_depth)):
            return self._run(run, args, kwargs, info)
        # the stream's phase, except that only the session's tracker (the dump's modules) knows
        # a recompute from a backward
        phase = call.phase
        if phase == "forward":  # s.module_info(), inlined: the stream saw no backward running
            frames = getattr(s.tracker._local, "stack", None)  # ModuleTracker.current()
            if frames:
                frame = frames[-1]
                module, module_class, fwd, tag = frame.path, frame.cls, None, None
            else:
                module, module_class, fwd, tag = "", None, None, None
        else:
            if phase == "backward" or phase == "recompute":
                phase = s.phase()
            module, module_class, fwd, tag = s.module_info()
        base, op = info.base, info.op
        o = s.options
        if (o.phases is not None or s._scope is not None or s._ops is not None or s._exclude is not None) \
                and not s.passes_filters(base, op, phase, module):  # s.wants(): the step is enabled (above)
            return self._run(run, args, kwargs, info)
        extra = self._extra.get(id(info.func))
        if extra is None:
            extra = self._extra[id(info.func)] = _dump_info(info)
        view, writes = info.view, info.writes
        flags = extra.flags.copy()  # the constant flags, made once per overload
        if tag is not None:
            node = tag.get("node")
            if node:
                flags["node"] = node
        if info.collective:  # distdump: the process group and peer (capture/collectives.py)
            flags.update(collective_flags(info.func, args, kwargs))
        rec = s.new_record(prefix=info.prefix, base=base, op=op, level="aten", phase=phase, module=module,
                           module_class=module_class, fwd=fwd, flags=flags)
        if rec is None:
            return self._run(run, args, kwargs, info)
        unmeasured: dict[str, str] = {}
        # s.busy = True / False, inlined (the session is not busy here: checked above)
        ts = _tool_state
        s._busy = True
        ts.busy = getattr(ts, "busy", 0) + 1
        try:
            rec.tensors = s.describe(flat_args(args, kwargs), "input", rec.id, link=True,
                                     no_values=extra.in_no_values, unmeasured=unmeasured)
        finally:
            s._busy = False
            ts.busy -= 1
        out = run(*args, **kwargs)
        s._busy = True
        ts.busy = getattr(ts, "busy", 0) + 1
        # a view's outputs share their base's version counter once the dispatcher returns
        vv = view_version(args) if view else None
        try:
            if writes:
                written = written_tensors(args, kwargs, writes)
                s.note_writes(written)
            elif base in _SAME_VALUES and args:
                s.same_values(args[0], out, _SAME_VALUES[base], vv)
            elif base == "expand" and args:
                s.expanded_values(args[0], out, vv)
            outs = flat_outputs(out)
            if extra.factory:
                s.uninit.mark(v for _, v in outs)
            elif s.uninit._ptrs and not view:  # (UninitStorages.__bool__, inlined)
                s.uninit.written(v for _, v in outs)
            s._out_version = vv
            try:
                rec.tensors += s.describe(outs, "output", rec.id, link=False, no_values=extra.out_no_values,
                                          unmeasured=unmeasured)
            finally:
                s._out_version = None
            if unmeasured:
                rec.flags["unmeasured"] = unmeasured
            if phase == "optimizer" and self._param_names is not None:
                rec.flags.update(self._param_names.flags(args, kwargs, out))
            if len(outs) == 1 and outs[0][1].__class__ is Tensor:  # s.note_outputs(), inlined
                v = outs[0][1]
                memo = s._producers
                ver = v._version if vv is None else vv
                if len(memo._d) < memo._limit:
                    memo._d[id(v)] = (_weakref(v), (rec.id, 0, ver))
                else:  # the memo sweeps its dead entries
                    memo[v] = (rec.id, 0, ver)
            else:
                s.note_outputs(rec.id, outs, version=vv)
            if writes:
                s.expect_version_bump(written if not any(w[2] for w in writes)
                                      else written_tensors(args, kwargs, writes, lists=False))
            pending = s._pending  # s.commit(rec), inlined
            pending.append(rec)
            if len(pending) >= s.options.batch_size or s._pending_bytes > (64 << 20):
                s.flush()
        finally:
            s._busy = False
            ts.busy -= 1
        return out
