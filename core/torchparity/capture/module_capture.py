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
from torch.utils._pytree import tree_leaves

from ..records import module_record_name
from .module_tracker import Frame, ModuleTracker, tag_graph
from .session import CaptureSession, flat_args, flat_outputs


class ModuleCapture:
    """Listener on the tracker. ``record=False`` only tags autograd nodes (aten/api levels)."""

    def __init__(self, session: CaptureSession, tracker: ModuleTracker, record: bool) -> None:
        self.session = session
        self.tracker = tracker
        self.record = record
        self._open: dict[int, tuple[Any, set[int]]] = {}  # id(frame) -> (record, input grad_fn ids)
        self._param_hooks: "weakref.WeakKeyDictionary[torch.nn.Module, list[Any]]" = weakref.WeakKeyDictionary()
        self._handles: list[Any] = []
        self._grad_counters: dict[str, int] = {}
        tracker.on_enter.append(self.on_enter)
        tracker.on_exit.append(self.on_exit)

    def detach(self) -> None:
        if self.on_enter in self.tracker.on_enter:
            self.tracker.on_enter.remove(self.on_enter)
        if self.on_exit in self.tracker.on_exit:
            self.tracker.on_exit.remove(self.on_exit)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def new_step(self) -> None:
        self._grad_counters.clear()

    # ---- forward ---------------------------------------------------------------------------
    def on_enter(self, frame: Frame, args: tuple, kwargs: dict) -> tuple | None:
        """Describe the inputs now (the module may modify them in place); the record itself is
        created at exit, so its id comes after the ops inside the module."""
        s = self.session
        stop = {id(t.grad_fn) for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        pending = None
        new_args = None
        if self.record and s.enabled_step and not s.busy:
            if s.options.params and frame.module not in self._param_hooks:
                self._hook_params(frame)
            phase = "recompute" if frame.recompute else s.phase()
            if s.wants(frame.cls, frame.cls, phase, frame.path):
                s.busy = True
                try:
                    tensors = s.describe(flat_args(args, kwargs), "input", -1, link=True)
                    if s.options.params:
                        tensors += s.describe(
                            [(n, p) for n, p in frame.module.named_parameters(recurse=False)], "param", -1, link=False)
                    pb = None
                    if (s.options.backward and phase == "forward" and torch.is_grad_enabled()
                            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
                        new_args, pb = self._alias_inputs(frame, args)
                    pending = (phase, tensors, pb)
                finally:
                    s.busy = False
        self._open[id(frame)] = (pending, stop)
        return new_args

    def on_exit(self, frame: Frame, args: tuple, kwargs: dict, output: Any) -> None:
        s = self.session
        pending, stop = self._open.pop(id(frame), (None, set()))
        rec = None
        if pending is not None:
            phase, tensors, pb = pending
            rec = s.new_record(prefix="Module", base=frame.path, op=frame.cls, level="module", phase=phase,
                               module=frame.path, module_class=frame.cls,
                               name=module_record_name(frame.path, frame.cls, phase, frame.call_index))
            if pb is not None and rec is not None:
                pb["fwd"] = rec.id
        if torch.is_grad_enabled() and not frame.recompute:
            tag_graph(output, {"module": frame.path, "module_class": frame.cls,
                               "fwd": rec.id if rec is not None else None, "node": None}, stop_at=stop)
        if rec is None:
            return
        s.busy = True
        try:
            outs = flat_outputs(output)
            rec.tensors = tensors + s.describe(outs, "output", rec.id, link=False)
            s.note_outputs(rec.id, outs, overwrite=False)
            if pb is not None:
                for arg, v in outs:
                    if isinstance(v, torch.Tensor) and v.requires_grad and v.grad_fn is not None:
                        v.register_hook(functools.partial(self._grad_out, pb, arg))
            s.commit(rec)
        finally:
            s.busy = False

    # ---- backward ----------------------------------------------------------------------------
    def _alias_inputs(self, frame: Frame, args: tuple) -> tuple[tuple, dict[str, Any]]:
        pb: dict[str, Any] = {"frame": (frame.path, frame.cls, frame.call_index), "fwd": None,
                              "out": [], "in": [], "n_in": 0, "done": False}
        new = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                alias = a.view_as(a)
                alias.register_hook(functools.partial(self._grad_in, pb, str(i)))
                new[i] = alias
                pb["n_in"] += 1
        return tuple(new), pb

    def _grad_out(self, pb: dict[str, Any], arg: str, grad: torch.Tensor) -> None:
        pb["out"].append((arg, grad))

    def _grad_in(self, pb: dict[str, Any], arg: str, grad: torch.Tensor) -> None:
        pb["in"].append((arg, grad))
        if len(pb["in"]) >= pb["n_in"] and not pb["done"]:
            pb["done"] = True
            s = self.session
            path, cls, idx = pb["frame"]
            if not s.wants(cls, cls, "backward", path):
                return
            rec = s.new_record(prefix="Module", base=path, op=cls, level="module", phase="backward",
                               module=path, module_class=cls, fwd=pb["fwd"],
                               name=module_record_name(path, cls, "backward", idx))
            if rec is None:
                return
            prev, s.busy = s.busy, True
            try:
                rec.tensors = s.describe(sorted(pb["out"]), "input", rec.id, link=False)
                rec.tensors += s.describe(sorted(pb["in"]), "output", rec.id, link=False)
                s.commit(rec)
            finally:
                s.busy = prev
            pb["out"].clear()
            pb["in"].clear()

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
        if not s.enabled_step or param.grad is None or not s.wants(cls, "parameters_grad", "backward", path):
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
