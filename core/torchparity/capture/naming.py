"""Name the capture session's records, and choose which of them the dump keeps.

A mixin of :class:`~torchparity.capture.session.CaptureSession`. An interceptor asks
:meth:`RecordNaming.wants` (the step, then the phase / scope / ops / exclude_ops filters) before
computing anything, and gets its record from :meth:`RecordNaming.new_record`: named
``<prefix>.<base>.<n>.<phase>`` by per-step counters and, at the api and module levels, numbered
in execution order across the dump (:meth:`RecordNaming.seq_name`). The filters that can only be
decided once a record is named (``op_range``, ``skip``, the ``seq:`` entries of ``ops``) are
applied there; counters advance even for a record filtered out, so names stay stable across runs
of the same script, whatever is selected.
"""

from __future__ import annotations

from typing import Any

import torch

from ..records import OpRecord, op_record
from .module_tracker import ModuleTracker, in_backward
from .options import DumpOptions, compile_patterns, matches
from .stacks import StackTable


class RecordNaming:
    """Mixin of :class:`~torchparity.capture.session.CaptureSession`: the filters' state is set by
    :meth:`_init_filters`; the per-step counters (``_next_id``, ``_name_counters``,
    ``_call_counters``, reset by ``advance_step``), the step and its tier (``enabled_step``,
    ``module_step``), the rank, the stack table and the options are the session's attributes."""

    options: DumpOptions
    tracker: ModuleTracker
    step: int
    in_optimizer: bool
    enabled_step: bool
    last_filtered_name: str
    _rank: int
    _stacks: StackTable | None
    _next_id: int
    _name_counters: dict[tuple[str, str, str], int]
    _call_counters: dict[tuple[str, str, str], int]

    def _init_filters(self, options: DumpOptions) -> None:
        """The filters' state, from the options the dump was given: the ``ops``, ``exclude_ops`` and
        ``scope`` patterns compiled, the ``op_range`` and ``skip`` counters, the sequence numbers."""
        self._filter_count = 0
        self._in_range = options.op_range is None or options.op_range[0] is None
        self._range_done = False
        self._seq_counters: dict[str, int] = {}  # "fwd"/"bwd" -> api/module records numbered so far (all steps)
        self._ops = compile_patterns(options.ops)
        # ops entries "seq:<sequence name>" select single ops; they can only be decided once numbered
        self._seq_ops = {p[4:] for p in options.ops or [] if p.startswith("seq:")}
        if not self._ops:  # only "seq:" entries
            self._ops = None
        # with sequence names, the ops filter is applied after numbering, so that a name such as
        # "torch.relu.3.fwd" means the same op whatever ops are selected
        self._defer_ops = bool(self._seq_ops) or options.seq_names
        self._exclude = compile_patterns(options.exclude_ops)
        self._scope = compile_patterns([s if any(c in s for c in "*?[") or s.startswith("re:") else s + "*" for s in options.scope] if options.scope else None)

    # ---- naming ----------------------------------------------------------------------------
    def phase(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if in_backward():
            frame = self.tracker.current()
            return "recompute" if frame is not None and frame.recompute else "backward"
        return "forward"

    def _counter(self, key: Any) -> int:
        n = self._name_counters.get(key, 0)
        self._name_counters[key] = n + 1
        return n

    def _call_index(self, module: str, op: str, phase: str) -> int:
        k = (module, op, phase)
        n = self._call_counters.get(k, 0)
        self._call_counters[k] = n + 1
        return n

    # ---- filters ---------------------------------------------------------------------------
    def wants(self, name_base: str, op: str, phase: str, module: str) -> bool:
        """Cheap pre-check before any statistics are computed."""
        return self.enabled_step and self.passes_filters(name_base, op, phase, module)

    def wants_module(self, name_base: str, op: str, phase: str, module: str) -> bool:
        """:meth:`wants` for module records, which a light step takes too."""
        return self.module_step and self.passes_filters(name_base, op, phase, module)

    def passes_filters(self, name_base: str, op: str, phase: str, module: str) -> bool:
        """The phase / scope / ops / exclude_ops filters (the step is not considered)."""
        o = self.options
        if o.phases is not None and phase not in o.phases:
            return False
        if self._scope is not None and not matches(self._scope, module):
            return False
        if self._ops is not None and not self._defer_ops and not matches(self._ops, name_base, op):
            return False
        if self._exclude is not None and matches(self._exclude, name_base, op):
            return False
        return True

    @staticmethod
    def _is(name: str, seq_name: str | None, bound: str) -> bool:
        return name == bound or name.startswith(bound + ".") or (seq_name is not None and seq_name == bound)

    def seq_name(self, op: str, level: str, phase: str) -> str | None:
        """Number an api/module record in execution order, per direction, across the whole dump:
        ``<API>.<n>.<fwd|bwd>`` (``torch.nn.Conv1d.6.fwd``, ``torch.relu.7.fwd``; from 0). Module
        classes of ``torch.nn`` are spelled ``torch.nn.<Class>``. None for aten records."""
        if level not in ("api", "module"):
            return None
        d = "bwd" if phase == "backward" else "fwd"
        n = self._seq_counters.get(d, 0)
        self._seq_counters[d] = n + 1
        api = op
        if level == "module" and "." not in op and isinstance(getattr(torch.nn, op, None), type):
            api = f"torch.nn.{op}"
        return f"{api}.{n}.{d}"

    def _range_and_skip(self, name: str, seq_name: str | None = None, base: str = "", op: str = "") -> bool:
        o = self.options
        if o.op_range is not None:
            first, last = o.op_range
            if self._range_done:
                return False
            if not self._in_range:
                if self._is(name, seq_name, first):
                    self._in_range = True
                else:
                    return False
            if last is not None and self._is(name, seq_name, last):
                self._range_done = True
                if o.op_range_end == "exclusive":
                    return False
        # deferred ops filter: after the range, so that unselected ops still open and close it
        if self._defer_ops and (self._ops is not None or self._seq_ops) \
                and not (self._ops is not None and matches(self._ops, base, op)) \
                and not (seq_name is not None and seq_name in self._seq_ops):
            return False
        if o.skip > 1:
            self._filter_count += 1
            if (self._filter_count - 1) % o.skip:
                return False
        return True

    # ---- records ---------------------------------------------------------------------------
    def new_record(self, *, prefix: str, base: str, op: str, level: str, phase: str, module: str,
                   module_class: str | None, fwd: int | None = None, name: str | None = None,
                   flags: dict[str, Any] | None = None) -> OpRecord | None:
        """Allocate a named record (counters advance even when the record is filtered out by
        range/skip, so names stay stable)."""
        counters = self._name_counters
        key = (prefix, base, phase)
        counter = counters.get(key, 0)
        counters[key] = counter + 1
        if name is None:
            name = f"{prefix}.{base}.{counter}.{phase}"
        o = self.options
        seq = None
        if level == "api" or level == "module":
            seq = self.seq_name(op, level, phase)
        if (o.op_range is not None or self._defer_ops or o.skip > 1) and not self._range_and_skip(name, seq, base, op):
            self.last_filtered_name = name
            return None
        rid = self._next_id
        self._next_id = rid + 1
        stack = self._stacks.current() if self._stacks is not None and phase != "backward" else None
        if seq is not None and o.seq_names:
            flags = {**(flags or {}), "seq_name": seq}
        ck = (module, op, phase)
        calls = self._call_counters
        call_index = calls.get(ck, 0)
        calls[ck] = call_index + 1
        return op_record(rid, name, op, level, phase, module, call_index, self.step, self._rank, module_class,
                         fwd, stack, flags or {})
