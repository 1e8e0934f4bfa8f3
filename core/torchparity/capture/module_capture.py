"""Module-level capture: one record per module call (forward and backward) and per parameter
gradient, driven by the :class:`~.module_tracker.ModuleTracker`'s global hooks.

Also tags the autograd nodes each module creates with its path, so backward ops at every level
are attributed to the module (and, at the API level, the op) that created them.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..records import module_record_name
from .compute_dtype import compute_dtype
from .grad_capture import GradWatch, next_sequence_nr, watch_call
from .module_tracker import Frame, ModuleTracker, tag_graph
from .flatten import flat_args, flat_outputs
from .session import CaptureSession


class ModuleCapture:
    """Listener on the tracker. ``record=False`` only tags autograd nodes (aten/api levels
    without a light tier); with ``record=True`` it records on the steps whose
    :attr:`CaptureSession.module_step` is set (module level, or a light step). ``tag=False``
    (module level alone): no tags, nobody reads them."""

    def __init__(self, session: CaptureSession, tracker: ModuleTracker, record: bool, tag: bool = True) -> None:
        self.session = session
        self.tracker = tracker
        self.record = record
        # tag autograd nodes only for an op-level capture (api/aten) that names backward ops by
        # them: module level alone attributes backward by its own hooks (a walk of each call's
        # nodes in Python: ~160 us per module call on a GPU machine's host)
        self.tag = tag
        self._open: dict[int, tuple[Any, list[Any]]] = {}  # id(frame) -> (pending record, input grad_fns)
        self._param_hooks: "weakref.WeakKeyDictionary[torch.nn.Module, list[Any]]" = weakref.WeakKeyDictionary()
        self._handles: list[Any] = []
        self._grad_counters: dict[str, int] = {}
        self._pending_bw: list[GradWatch] = []
        self._walked: dict[int, tuple[Any, list[Any]]] = {}  # tag_graph's per-call walks (its ``walked``)
        tracker.on_enter.append(self.on_enter)
        tracker.on_exit.append(self.on_exit)
        tracker.want_seq = True  # backward attribution of the ops a module runs between its children

    def detach(self) -> None:
        if self.on_enter in self.tracker.on_enter:
            self.tracker.on_enter.remove(self.on_enter)
        if self.on_exit in self.tracker.on_exit:
            self.tracker.on_exit.remove(self.on_exit)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._walked.clear()

    def new_step(self) -> None:
        self._grad_counters.clear()

    # ---- forward ---------------------------------------------------------------------------
    def on_enter(self, frame: Frame, args: tuple, kwargs: dict) -> tuple | None:
        """Describe the inputs now (the module may modify them in place); the record itself is
        created at exit, so its id comes after the ops inside the module."""
        s = self.session
        # the inputs' nodes themselves (not their ids: on torch < 2.2 a node's Python wrapper, and
        # so its id, changes once the last reference is gone)
        stop = [t.grad_fn for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        pending = None
        if self.record and s.module_step and not s.busy:
            if s.options.params and frame.module not in self._param_hooks:
                self._hook_params(frame)
            phase = "recompute" if frame.recompute else s.phase()
            if s.wants_module(frame.cls, frame.cls, phase, frame.path):
                s.busy = True
                try:
                    tensors = s.describe(flat_args(args, kwargs), "input", -1, link=True)
                    if s.options.params:
                        tensors += s.describe(
                            [(n, p) for n, p in frame.module.named_parameters(recurse=False)], "param", -1, link=False)
                    seq0 = None
                    if (s.options.backward and phase == "forward" and torch.is_grad_enabled()
                            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
                        seq0 = next_sequence_nr()
                    pending = (phase, tensors, seq0)
                finally:
                    s.busy = False
        self._open[id(frame)] = (pending, stop)
        return None

    def on_exit(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        s = self.session
        pending, stop = self._open.pop(id(frame), (None, []))
        rec = None
        cd = None
        if pending is not None:
            phase, tensors, seq0 = pending
            cd = compute_dtype(frame.module, tree_flatten(output)[0])
            rec = s.new_record(prefix="Module", base=frame.path, op=frame.cls, level="module", phase=phase,
                               module=frame.path, module_class=frame.cls,
                               name=module_record_name(frame.path, frame.cls, phase, frame.call_index),
                               flags={"compute_dtype": cd} if cd else None)
        # tags are read by the api/aten records of full steps only (a light step's module records
        # observe their own gradients): between full steps no walk
        if self.tag and s.tier == "full" and torch.is_grad_enabled() and not frame.recompute:
            tag_graph(output, {"module": frame.path, "module_class": frame.cls,
                               "fwd": rec.id if rec is not None else None, "node": None}, stop_at=stop,
                       since=frame.seq0, walked=self._walked)
        if self._walked and not self.tracker.stack:  # the outermost module returned: no walk needs them
            self._walked.clear()
        if pending is None:
            return
        s.busy = True
        try:
            outs = flat_outputs(output)
            if seq0 is not None:  # also when the forward record was filtered out (range/skip)
                inputs = [(str(i), a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                watch = watch_call(inputs, outs, seq0, self._emit_backward,
                                   meta=(frame.path, frame.cls, frame.call_index, rec.id if rec is not None else None, cd))
                if watch is not None:
                    self._pending_bw.append(watch)
            if rec is not None:
                rec.tensors = tensors + s.describe(outs, "output", rec.id, link=False)
                s.note_outputs(rec.id, outs, overwrite=False)
                s.commit(rec)
        finally:
            s.busy = False

    # ---- backward ----------------------------------------------------------------------------
    def _emit_backward(self, watch: GradWatch) -> None:
        s = self.session
        path, cls, idx, fwd, cd = watch.meta
        if not s.wants_module(cls, cls, "backward", path):
            return
        # the backward of a call computes in the precision its forward did (saved low-precision
        # tensors, autocast's casts), whatever autocast says while backward runs
        rec = s.new_record(prefix="Module", base=path, op=cls, level="module", phase="backward",
                           module=path, module_class=cls, fwd=fwd,
                           name=module_record_name(path, cls, "backward", idx),
                           flags={"compute_dtype": cd} if cd else None)
        if rec is None:
            return
        prev, s.busy = s.busy, True
        try:
            rec.tensors = s.describe(sorted(watch.grads_out, key=lambda kv: kv[0]), "input", rec.id, link=False)
            rec.tensors += s.describe(watch.summed_grads_in(), "output", rec.id, link=False)
            s.commit(rec)
        finally:
            s.busy = prev
        watch.grads_out.clear()
        watch.grads_in.clear()

    def flush_backward(self) -> None:
        """At a step boundary: emit backward records whose hooks did not all fire."""
        prev, self.session.busy = self.session.busy, False
        try:
            for w in self._pending_bw:
                if not w.done and w.has_data:
                    w.finish()
        finally:
            self.session.busy = prev
        self._pending_bw = [w for w in self._pending_bw if not w.done]
        if len(self._pending_bw) > 100000:
            self._pending_bw.clear()

    def _hook_params(self, frame: Frame) -> None:
        hooks = []
        if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            for pname, p in frame.module.named_parameters(recurse=False):
                if p.requires_grad:
                    hooks.append(p.register_post_accumulate_grad_hook(
                        functools.partial(self._param_grad, frame.path, frame.cls, pname)))
        self._handles.extend(hooks)
        self._param_hooks[frame.module] = hooks

    def _param_grad(self, path: str, cls: str, pname: str, param: torch.Tensor) -> None:
        s = self.session
        if not s.module_step or param.grad is None or not s.wants_module(cls, "parameters_grad", "backward", path):
            return
        full = f"{path}.{pname}" if path else pname
        n = self._grad_counters.get(full, 0)
        self._grad_counters[full] = n + 1
        rec = s.new_record(prefix="Grad", base=full, op="parameters_grad", level="module", phase="backward",
                           module=path, module_class=cls, name=f"Grad.{full}.{n}.backward")
        if rec is None:
            return
        prev, s.busy = s.busy, True
        try:
            rec.tensors = s.describe([(pname, param.grad)], "grad", rec.id, link=False)
            s.commit(rec)
        finally:
            s.busy = prev
