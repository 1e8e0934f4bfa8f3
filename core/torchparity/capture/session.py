"""The capture session: turns intercepted calls into op records and hands them to the writer.

One session serves all capture levels. The interceptors (module hooks in
:mod:`.module_tracker`, :class:`.api_mode.ApiCaptureMode`, :class:`.aten_mode.AtenCaptureMode`)
call :meth:`CaptureSession.record`; the session applies the filters, names the op, computes the
statistics on the device, links each input to the record that produced it, and batches records
for the writer. It owns the step counter and the per-step name counters, so op names are stable
across runs of the same script. Its mixins hold the rest: naming and filtering records
(:mod:`.naming`), the batch pending for the writer (:mod:`.pending`), reusing measurements
(:mod:`.measure_reuse`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Collection, Iterable
from weakref import ref as _weakref

import torch
from torch import Tensor

from .batch import RecordSink
from .options import DumpOptions
from ..records import TensorEntry, scalar_entry
from .module_tracker import ModuleTracker, current_backward_info, in_backward
from .outside_backward import OutsideBackward
from .stacks import StackTable
from .host_copies import HostCopier, HostCopy
from .stat_batch import StatBatcher
from .stats import host_stats, tensor_checksum
from .tool_state import _tool_state, tool_is_busy, tool_work  # noqa: F401 (re-exported)
from .flatten import _POS, flat_args, flat_outputs  # noqa: F401 (re-exported)
from .measure_reuse import MeasurementReuse
from .naming import RecordNaming
from .pending import PendingBatch, StatRows  # noqa: F401 (StatRows re-exported)
from .ranks import _distributed, current_rank, world_size  # noqa: F401 (re-exported)
from .tensor_memo import TensorMemo  # noqa: F401 (re-exported)
from .uninit import UninitStorages
from .collectives import Parameter, is_dtensor, local_value  # distdump: DTensors measured as their local shard

_SCALAR_TYPES = (int, float, bool, str, type(None))
_NO_MODULE: tuple[str, None, None, None] = ("", None, None, None)
_new = object.__new__

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_DEVICE_NAMES: dict[torch.device, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def _scalar_value(x: Any) -> Any:
    if isinstance(x, _SCALAR_TYPES):
        if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
            return str(x)
        return x
    if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(x)
    if isinstance(x, (list, tuple)) and len(x) <= 16 and all(isinstance(v, (int, float, bool)) for v in x):
        return list(x)
    return None


class CaptureSession(RecordNaming, PendingBatch, MeasurementReuse):
    """State shared by all interceptors of one dump."""

    def __init__(self, options: DumpOptions, writer: RecordSink, tracker: ModuleTracker) -> None:
        self.options = options
        self.writer = writer
        self.tracker = tracker
        self.step = 0
        self.in_optimizer = False
        self._busy = False
        self.api_collective_depth = 0  # >0 while an API-level collective call is running
        self.last_filtered_name = ""  # name of the last record new_record() filtered out (range/skip)
        self._lock = threading.RLock()
        self._next_id = 0
        self._name_counters: dict[tuple[str, str, str], int] = {}  # (prefix, base, phase) -> count
        self._call_counters: dict[tuple[str, str, str], int] = {}
        self._producers = TensorMemo()  # tensor -> (rid, out_idx, version)
        # Statistics reuse (only while every write is seen, i.e. at aten level; see reuse_stats):
        # tensor -> (version, storage ptr, storage write generation, stats) and ptr -> generation
        self.reuse_stats = False
        self._api_reuse = False  # set by the API mode: reuse unless torch.distributed is initialised
        self._measured = TensorMemo()
        self._write_gen: dict[int, int] = {}
        #: while a view op's outputs are described (aten level): the version counter they will
        #: have once the dispatcher returns. The ADInplaceOrView kernel, above every dispatch mode,
        #: makes a view share its base's counter only after the mode returned; inside it the view
        #: still has a fresh counter at 0, so memo entries keyed on that 0 never matched again
        #: (every weight's transpose was measured anew when the matmul read it) -- see view_version
        self._out_version: int | None = None
        self.uninit = UninitStorages()  # storages made by empty* and not written yet (aten level)
        #: follow_tier()'s callbacks: the capture modes that leave their stacks between full steps
        self.step_listeners: list[Callable[[], None]] = []
        #: the capture modes change their stacks through it (a step may begin inside backward)
        self.outside_backward = OutsideBackward(tracker)
        # values off the CPU (and CPU values with device_stats) are measured by the batcher: one
        # kernel per value, one device-to-host copy per flush; CPU values read at once otherwise
        self._batcher = StatBatcher()
        self._host_stats = not options.device_stats
        # md5/tensor modes: values off the CPU (CPU values with device_stats) reach the host by
        # asynchronous copies, finished by the writer thread
        self._copier = HostCopier()
        self._init_pending()
        self._tensor_seq = 0
        self._init_filters(options)
        self._rank = current_rank()
        self._stacks = StackTable(self._on_new_stack) if options.stack else None
        self.enabled_step = self._step_enabled()

    # ---- steps -----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while the tool itself computes (its ops must not be recorded); mirrored in the
        thread-wide :func:`tool_is_busy` so other torchparity dispatch modes skip those ops too."""
        return self._busy

    @busy.setter
    def busy(self, value: bool) -> None:
        if value != self._busy:
            _tool_state.busy = getattr(_tool_state, "busy", 0) + (1 if value else -1)
        self._busy = value

    def _step_enabled(self) -> bool:
        """Decide what the current step records (DumpOptions.tier; nothing on a rank not
        selected) and return whether it is captured fully (:attr:`enabled_step`, which a façade
        may clear to pause). Also sets :attr:`light_step` (module records only) and
        :attr:`options` (the light tier's options on a light step: module level, statistics)."""
        full = self.__dict__.setdefault("_full_options", self.options)  # the options as given
        tier = full.tier(self.step) if full.ranks is None or self._rank in full.ranks else None
        self.tier = tier  # the schedule's decision (a façade may still pause a full step: enabled_step)
        self.light_step = tier == "light"
        self.options = full.light_options() if self.light_step else full
        self._full_modules = "module" in full.levels
        return tier == "full"

    @property
    def module_step(self) -> bool:
        """Module records are wanted now: a full step at module/mix level, or a light step."""
        return self.light_step or (self.enabled_step and self._full_modules)

    def advance_step(self) -> None:
        """Close the current step: flush its records and start counting the next one."""
        with self._lock:
            self.flush()
            self.writer.end_step(self.step)
            self.step += 1
            self._next_id = 0
            self._name_counters.clear()
            self._call_counters.clear()
            self._producers.clear()
            # Measurements stay valid across steps (parameters and optimizer state are read again
            # unchanged at the next step) while every write is seen; saved-tensor keys do not
            # (files are per step), and the write table is bounded.
            if self.options.mode == "tensor" or len(self._write_gen) > 1_000_000:
                self._measured.clear()
                self._write_gen.clear()
            if self._api_reuse and self.reuse_stats and _distributed():
                self.reuse_stats = False
            self.tracker.new_step()
            if self._stacks is not None:
                self._stacks.reset()
            self._rank = current_rank()
            self.enabled_step = self._step_enabled()
        for listener in list(self.step_listeners):  # outside the lock: a listener may re-enter a mode
            self.outside_backward.run(listener)

    def follow_tier(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` now and once each step's tier (:attr:`tier`) is decided, outside any
        backward pass (:mod:`.outside_backward`): a capture mode follows the schedule with it,
        leaving its stack between full steps."""
        self.step_listeners.append(fn)
        self.outside_backward.run(fn)

    def unfollow_tier(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn`` (its mode is leaving), including a call still waiting for the end
        of a backward pass."""
        if fn in self.step_listeners:
            self.step_listeners.remove(fn)
        self.outside_backward.cancel(fn)

    # ---- tensors ---------------------------------------------------------------------------
    def describe(self, values: Iterable[tuple[str, Any]], io: str, rid: int, link: bool,
                 no_values: Collection[str] = frozenset(),
                 unmeasured: dict[str, str] | None = None) -> list[TensorEntry]:
        """Tensor entries for (arg, value) pairs; statistics are queued on the device.

        Args named in ``no_values`` hold memory whose content means nothing (the destination of
        ``fill_``/``normal_``/``copy_``, ``out=``, the result of ``empty``, a kernel's workspace),
        and so does a tensor whose storage :attr:`uninit` holds: their metadata is recorded, their
        values are not (they would differ run to run). With ``unmeasured``, each such tensor adds
        ``"<io>.<arg>": reason`` to it (``no_values`` may map arg -> reason).

        The hot path of every capture level (one call per side of every record): entries are made
        without the dataclass ``__init__`` and keep the tensor's own shape and stride tuples (the
        writer thread turns them into JSON lists)."""
        o = self.options
        entries: list[TensorEntry] = []
        want_io = o.io is None or (io in o.io) or (io in ("param", "grad") and "input" in o.io)
        why_of = no_values.get if isinstance(no_values, dict) else None
        uninit = self.uninit if self.uninit._ptrs else None  # describing marks nothing: asked once
        producers = self._producers._d if link else None  # TensorMemo.get(), inlined below
        append = entries.append
        # the common case, measured here without a call per value (_measure's statistics-mode
        # path with reuse: see _measure_stats)
        fast = want_io and self.reuse_stats and o.mode == "statistics"
        for arg, v in values:
            if isinstance(v, Tensor):
                try:
                    stride = v.stride()
                except RuntimeError:
                    stride = None
                dtype, device = v.dtype, v.device
                # tensor_entry(), inlined: this line runs for every value the capture sees
                e = _new(TensorEntry)
                e.io, e.arg, e.dtype, e.shape, e.stride, e.device, e.requires_grad = \
                    io, arg, _DTYPE_NAMES.get(dtype) or _dtype_name(dtype), v.shape, stride, \
                    _DEVICE_NAMES.get(device) or _device_name(device), v.requires_grad
                if producers is not None:
                    prod = producers.get(id(v))
                    if prod is not None and prod[0]() is v:
                        prod = prod[1]
                        if prod[2] == v._version:
                            e.producer = [prod[0], prod[1]]
                if no_values and arg in no_values:
                    why: str | None = why_of(arg, "not a value") if why_of is not None else "not a value"
                elif uninit is not None and uninit.holds(v):
                    why = "uninitialised memory"
                else:
                    why = None
                if why is not None:
                    if unmeasured is not None:
                        unmeasured[f"{io}.{arg}"] = why
                elif fast and (v.__class__ is Tensor or v.__class__ is Parameter):
                    self._measure_stats(v, e)
                elif want_io:
                    self._measure(v, e)
                append(e)
            elif v is None:
                append(scalar_entry(io, arg, "none", None))
            else:
                t = v.__class__
                if t is int or t is bool or t is str:
                    append(scalar_entry(io, arg, "scalar", v))
                else:
                    val = _scalar_value(v)
                    if val is not None:
                        append(scalar_entry(io, arg, "scalar", val))
        return entries

    # ---- statistics reuse ------------------------------------------------------------------
    # A tensor is measured once per value: when an op's input is a tensor already measured (an
    # earlier op's output, a parameter used again) and neither its version counter nor any write
    # to its storage seen since says it changed, its statistics are reused. Writes through an
    # alias with its own version counter (``p.data.add_()``) are why the storage generation is
    # kept: the aten-level mode reports every kernel's written arguments (note_writes). Other
    # levels do not see every write, so they always measure.
    def _measure(self, v: torch.Tensor, e: TensorEntry) -> None:
        """Fill ``e`` with what the mode asks for (statistics; checksum; saved tensor), reusing
        what was measured for the same tensor value earlier in the step.

        A remembered measurement is ``(stats, checksum, saved key, shape of the saved copy)``;
        the checksum and saved copy are left out (None) when the value was reached through a
        permuting view (transpose), whose row-major bytes differ from its base's."""
        if v.__class__ is not Tensor and v.__class__ is not Parameter and is_dtensor(v):  # distdump: a DTensor
            v = local_value(v)  # is measured as the shard this rank holds (capture/collectives.py)
            e.shape, e.stride = v.shape, v.stride()
        o = self.options
        hit = None
        if self.reuse_stats:  # _lookup(), inlined: asked for every value
            m = self._measured._d.get(id(v))
            if m is not None and m[0]() is v:
                m = m[1]
                try:
                    ver = self._out_version if self._out_version is not None else v._version
                    if m[0] == ver and self._write_gen.get(m[1], 0) == m[2]:
                        hit = m[3]
                except RuntimeError:  # inference tensors have no version counter
                    pass
        if hit is None:
            st = host_stats(v) if self._host_stats and v.is_cpu else self._batcher.add(v)
            md5 = key = key_shape = None
        else:
            st, md5, key, key_shape = hit
        changed = hit is None
        if o.mode == "md5" and md5 is None:
            md5, changed = self._checksum(v), True
        elif o.mode == "tensor" and v.layout == torch.strided and v.device.type != "meta":
            shape = tuple(v.shape)
            if key is not None and key_shape == shape:  # the same values were saved already
                self._pending_refs.append(e)
            else:
                self._tensor_seq += 1
                key, key_shape, changed = f"{self._tensor_seq}.{e.io}.{e.arg}", shape, True
                cpu = self._host_copy(v)  # a CPU tensor, or a HostCopy the writer waits for
                self._pending_tensors[key] = cpu
                self._pending_owner[key] = e
                self._pending_bytes += cpu.nbytes if isinstance(cpu, HostCopy) else cpu.numel() * cpu.element_size()
        if changed and self.reuse_stats:
            self._remember(v, (st, md5, key, key_shape), self._out_version)
        if st is not None:  # the writer thread makes the record's dict (StatRows)
            self._pending_stats.append(st)
            self._pending_slots.append(e)
        if isinstance(md5, HostCopy):  # the writer thread fills it in once the copy is done
            self._pending_checksums.append((e, md5))
        elif md5 is not None:
            e.md5 = md5
        if key is not None and o.mode == "tensor":
            e.file, e.key = "pending", key

    def _measure_stats(self, v: torch.Tensor, e: TensorEntry) -> None:
        """:meth:`_measure` for the common case, the same result with less work per value:
        statistics mode, reuse on, a plain tensor (no DTensor). A remembered
        measurement with a checksum (from a step of another mode) goes the general way."""
        m = self._measured._d.get(id(v))  # _lookup(), inlined
        hit = None
        ov = self._out_version  # a view's outputs: the version they will have (see __init__)
        if m is not None and m[0]() is v:
            m = m[1]
            try:
                if m[0] == (v._version if ov is None else ov) and self._write_gen.get(m[1], 0) == m[2]:
                    hit = m[3]
            except RuntimeError:  # inference tensors have no version counter
                pass
        if hit is not None:
            if hit[1] is not None:  # a checksum to copy into the entry
                self._measure(v, e)
                return
            st = hit[0]
        else:
            st = host_stats(v) if self._host_stats and v.is_cpu else self._batcher.add(v)
            try:  # _remember(), inlined
                ptr = v.untyped_storage().data_ptr()
                memo = self._measured
                d = memo._d
                ver = v._version if ov is None else ov
                if len(d) < memo._limit:
                    d[id(v)] = (_weakref(v), (ver, ptr, self._write_gen.get(ptr, 0), (st, None, None, None)))
                else:  # the memo sweeps its dead entries
                    memo[v] = (ver, ptr, self._write_gen.get(ptr, 0), (st, None, None, None))
            except (RuntimeError, NotImplementedError, TypeError):  # no storage/version (inference, subclasses)
                pass
        if st is not None:  # the writer thread makes the record's dict (StatRows)
            self._pending_stats.append(st)
            self._pending_slots.append(e)

    def _async_copies(self, v: torch.Tensor) -> bool:
        """Values off the CPU go to the host by asynchronous copies; CPU values only with
        device_stats (the accelerator path forced: tests, the counting bench)."""
        return v.device.type != "cpu" or not self._host_stats

    def _checksum(self, v: torch.Tensor) -> str | HostCopy:
        """md5 mode: the checksum now (a CPU value, hashed in place), or a copy on its way to the
        host that the writer thread hashes (no host sync here)."""
        if self._async_copies(v) and v.numel():
            c = self._copier.copy(v)
            if c is not None:
                self._pending_bytes += c.nbytes  # pending host bytes: commit() flushes past its limit
                return c
        return tensor_checksum(v)  # the CPU; or blocking: pool full, or a value the pool cannot take

    def _host_copy(self, v: torch.Tensor) -> torch.Tensor | HostCopy:
        """tensor mode: the value's host copy, taken now (a CPU value) or on its way."""
        if self._async_copies(v):
            if not v.numel():  # nothing to copy (and no transfer to wait for)
                return torch.empty(v.shape, dtype=v.dtype)
            c = self._copier.copy(v)
            if c is not None:
                return c
        return v.detach().to("cpu", copy=True).contiguous()

    # ---- records ---------------------------------------------------------------------------
    def module_info(self) -> tuple[str, str | None, int | None, dict[str, Any] | None]:
        """(module path, module class, forward record id, backward tag) for the current op."""
        frame = self.tracker.current()
        if not in_backward():
            return _NO_MODULE if frame is None else (frame.path, frame.cls, None, None)
        info = current_backward_info()
        if frame is not None and frame.recompute:
            return frame.path, frame.cls, None, info
        if info is not None:
            return info.get("module", ""), info.get("module_class"), info.get("fwd"), info
        return _NO_MODULE
