"""Aten-level capture: a TorchDispatchMode that records every kernel call.

It sees what the Python API cannot: the kernels autograd runs in backward, the optimizer's
``_foreach_*`` kernels, factory ops and collectives (``c10d`` ops). Inputs are described before the
kernel runs (so in-place ops are recorded with their inputs as they were), outputs after.
Backward kernels are attributed to the module that created their autograd node (see
:func:`~torchparity.capture.module_tracker.tag_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import ops as opinfo
from .optim_names import OptimizerParamNames
from .session import tool_is_busy
from .session import CaptureSession, flat_args, flat_outputs

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

_WHY_OVERWRITTEN = "overwritten by the op"
_WHY_OUT = "out= buffer"
_WHY_UNINIT = "uninitialised memory"
_WHY_WORKSPACE = "kernel workspace"


@dataclass(frozen=True)
class _OpInfo:
    """What the mode needs to know about one op overload (computed once per overload)."""

    base: str
    op: str
    collective: bool
    view: bool
    inplace: bool
    writes: tuple[tuple[int, str, bool], ...]
    random: bool
    factory: bool  # result is uninitialised memory (empty*)
    in_no_values: dict[str, str]  # input arg -> why it is described but not measured
    out_no_values: dict[str, str]  # output index -> why


def _op_info(func: Any) -> _OpInfo:
    base = opinfo.base_name(func)
    no_in = dict.fromkeys(_OVERWRITTEN_INPUT, _WHY_OVERWRITTEN) if base in _OVERWRITING else dict.fromkeys(_OUT_ARG, _WHY_OUT)
    no_in.update(dict.fromkeys(opinfo.workspace_inputs(func), _WHY_WORKSPACE))
    factory = base in _UNINITIALIZED_RESULT
    no_out = dict.fromkeys(_ALL_OUTPUTS, _WHY_UNINIT) if factory else {}
    no_out.update({str(i): _WHY_WORKSPACE for i in opinfo.workspace_outputs(func)})
    return _OpInfo(base, str(func), opinfo.is_collective(func), opinfo.is_view(func), opinfo.is_inplace(func),
                   opinfo.written_args(func), opinfo.is_random(func), factory, no_in, no_out)


_SKIP = frozenset({"detach", "alias", "lift_fresh", "_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"})


class AtenCaptureMode(TorchDispatchMode):
    """Records aten kernels into a :class:`CaptureSession`.

    With ``collectives_only=True`` it records only collective ops (used at the module/api levels,
    where collectives are not visible otherwise) and is otherwise a cheap pass-through.
    """

    def __init__(self, session: CaptureSession, collectives_only: bool = False) -> None:
        super().__init__()
        self.session = session
        self.collectives_only = collectives_only
        self._names: dict[Any, _OpInfo] = {}
        # this mode sees every kernel, so every write: the session may reuse statistics
        if not collectives_only:
            session.reuse_stats = True
        self._param_names = None if collectives_only else OptimizerParamNames(session.tracker)

    def __enter__(self) -> "AtenCaptureMode":
        if self._param_names is not None:
            self._param_names.start()
        try:
            return super().__enter__()
        except BaseException:
            if self._param_names is not None:
                self._param_names.stop()
            raise

    def __exit__(self, *exc: Any) -> Any:
        if self._param_names is not None:
            self._param_names.stop()
        return super().__exit__(*exc)

    def _info(self, func: Any) -> _OpInfo:
        info = self._names.get(func)
        if info is None:
            info = self._names[func] = _op_info(func)
        return info

    def _run(self, func: Any, args: tuple, kwargs: dict, info: _OpInfo) -> Any:
        """Run an unrecorded kernel; what it writes still invalidates statistics seen before, and
        what it allocates still counts for the uninitialised-memory bookkeeping."""
        out = func(*args, **kwargs)
        if not self.collectives_only:
            s = self.session
            if info.writes:
                s.note_writes(_written(args, kwargs, info.writes))
            if not s.busy and not tool_is_busy():
                self._track_uninit(info, out)
        return out

    def _track_uninit(self, info: _OpInfo, out: Any) -> None:
        """``empty*`` results start uninitialised; any other non-view result is fresh memory (a
        storage the allocator may have handed out again), so it is no longer uninitialised."""
        u = self.session.uninit
        if info.factory:
            u.mark(v for _, v in flat_outputs(out))
        elif u and not info.view:
            u.written(v for _, v in flat_outputs(out))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        s = self.session
        info = self._info(func)
        base, op, collective, view, inplace, writes, random = (info.base, info.op, info.collective, info.view,
                                                               info.inplace, info.writes, info.random)
        if s.busy or tool_is_busy() or base in _SKIP or func.namespace == "profiler" or (self.collectives_only and (not collective or s.api_collective_depth)) or not s.enabled_step:
            return self._run(func, args, kwargs, info)
        phase = s.phase()
        module, module_class, fwd, tag = s.module_info()
        if not s.wants(base, op, phase, module):
            return self._run(func, args, kwargs, info)
        prefix = "Distributed" if collective else "Aten"
        flags: dict[str, Any] = {}
        if inplace:
            flags["inplace"] = True
        if collective:
            flags["collective"] = True
        if view:
            flags["view"] = True
        if random:
            flags["random"] = True
        if tag is not None and tag.get("node"):
            flags["node"] = tag["node"]
        rec = s.new_record(prefix=prefix, base=base, op=op, level="aten", phase=phase, module=module,
                           module_class=module_class, fwd=fwd, flags=flags)
        if rec is None:
            return self._run(func, args, kwargs, info)
        unmeasured: dict[str, str] = {}
        s.busy = True
        try:
            rec.tensors = s.describe(flat_args(args, kwargs), "input", rec.id, link=True,
                                     no_values=info.in_no_values, unmeasured=unmeasured)
        finally:
            s.busy = False
        out = func(*args, **kwargs)
        s.busy = True
        try:
            if writes:
                s.note_writes(_written(args, kwargs, writes))
            elif base in _SAME_VALUES and args:
                s.same_values(args[0], out, _SAME_VALUES[base])
            elif base == "expand" and args:
                s.expanded_values(args[0], out)
            outs = flat_outputs(out)
            if info.factory:
                s.uninit.mark(v for _, v in outs)
            elif s.uninit and not view:
                s.uninit.written(v for _, v in outs)
            rec.tensors += s.describe(outs, "output", rec.id, link=False, no_values=info.out_no_values,
                                      unmeasured=unmeasured)
            if unmeasured:
                rec.flags["unmeasured"] = unmeasured
            if phase == "optimizer" and self._param_names is not None:
                rec.flags.update(self._param_names.flags(args, kwargs, out))
            s.note_outputs(rec.id, outs)
            if writes:
                s.expect_version_bump(_written(args, kwargs, writes, lists=False))
            s.commit(rec)
        finally:
            s.busy = False
        return out


def _written(args: tuple, kwargs: dict, writes: tuple[tuple[int, str, bool], ...], lists: bool = True) -> list[Any]:
    """The tensors in the written argument positions (lists of tensors flattened; left out
    with ``lists=False``)."""
    out: list[Any] = []
    for i, name, is_list in writes:
        if is_list and not lists:
            continue
        v = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(v, (list, tuple)):
            out.extend(v)
        elif v is not None:
            out.append(v)
    return out
