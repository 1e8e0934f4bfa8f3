"""The light tier of :class:`~torchparity.online.naninf.NanInfTracker`: what the steps between
op-level steps check (``every=N`` or ``steps=[...]`` with ``light="module"``).

On a light step the tracker sees no op: the op stream is paused for it (its dispatch mode leaves
the stack when no other consumer needs it). It screens each module's output as the module
returns (``max(|t|)``, one multi-tensor reduction per module call) and, at the step's end, every
parameter's gradient and every parameter (after the optimizer step; and as the step began). One
stack and one host read per step. A NaN/Inf is reported only when it reached a sink: the root
module's output or a parameter. A mask holding ``-inf`` inside the model, absorbed by a softmax,
is no finding; nor are gradients that overflowed while the parameters stayed finite (a
GradScaler skipped the step). A light finding names the first module whose output held the
sink's kind of value (NaN, else Inf), or the first parameter whose gradient or value held it; the
op is not known on a light step, so the next step is tracked op by op (if the NaN/Inf comes
again, its creating op is named as on any tracked step). Parameters that already held a NaN/Inf
as the step began are named as such, once.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from ..capture.op_stream import op_stream
from ..capture.tool_state import tool_work
from ..records import module_record_name
from .naninf_findings import BEFORE_STEP, NanInfFinding
from .naninf_rules import _FLOAT, _STRIDED, _flat_tensors, _screen


def _screens(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``max(|t|)`` of each of ``ts`` (0-d tensors on their devices; no host read): one
    multi-tensor reduction per device and dtype, one reduction per value where that is missing."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[Any] = [None] * len(ts)
    for idx in groups.values():
        vals = [ts[i] for i in idx]
        try:
            got = list(torch._foreach_norm(vals, math.inf))
        except (RuntimeError, NotImplementedError, TypeError):  # a backend without it
            got = [_screen(t) for t in vals]
        for i, s in zip(idx, got):
            out[i] = s
    return out


def _floats(ts: Any) -> list[torch.Tensor]:
    return [t for t in ts if isinstance(t, torch.Tensor) and t.dtype in _FLOAT and t.layout == _STRIDED and t.numel()]


def _bad(v: float) -> str | None:
    """"NaN", "Inf" or None (finite) for a screen's value."""
    if v != v:
        return "NaN"
    return "Inf" if v in (math.inf, -math.inf) else None


class LightTier:
    """Mixin of :class:`~torchparity.online.naninf.NanInfTracker`: the steps not tracked op by
    op (the stream paused for the tracker) and the light tier's screens on them."""

    def _follow_tier(self) -> None:
        """A step began: a step not tracked op by op needs no op, so the tracker pauses the op
        stream (its mode leaves the dispatch stack when no other consumer needs it); writes made
        meanwhile are not seen, so the memo is cleared before the next tracked op. Runs outside
        backward, on the thread that started the tracker (:class:`OutsideBackward`)."""
        if not self._attached:
            return
        if not self._active and not self._paused:
            self._paused = True
            self._stale = True
            op_stream().pause(self)
        elif self._active and self._paused:
            self._paused = False
            self._stale = True
            op_stream().resume(self)

    def _light_reset(self) -> None:
        self._light_outs: list[tuple[str, str | None, int, torch.Tensor]] = []  # (path, class, call, screen)
        # the parameters' screens as the root module's first call of the step began: (names, screens)
        self._light_before: tuple[list[str], list[torch.Tensor]] | None = None

    def _light_enter(self, frame: Any) -> None:
        """The root module's first call of a light step begins: screen the parameters as they
        are (a NaN/Inf already there came from an earlier step, not from this one)."""
        if frame.path != "" or frame.recompute or self._light_before is not None:
            return
        if self.model is None:  # the root module: whose parameters are the step's sinks
            self._light_root = weakref.ref(frame.module)
        values = [(n, p) for n, p in self._light_params() if _floats([p])]
        with tool_work(), torch.no_grad():
            self._light_before = ([n for n, _ in values], _screens([p.detach() for _, p in values]))

    def _light_exit(self, frame: Any, output: Any) -> None:
        """A module returned on a light step: screen its floating-point outputs."""
        if frame.recompute:
            return
        ts = _floats(_flat_tensors(output))
        if not ts:
            return
        with tool_work(), torch.no_grad():
            for s in _screens(ts):
                self._light_outs.append((frame.path, frame.cls, frame.call_index, s))

    def _light_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        root = self.model
        if root is None:
            ref = getattr(self, "_light_root", None)
            root = ref() if ref is not None else None
        return list(root.named_parameters()) if root is not None else []

    def _light_collect(self, keep: bool = False) -> list[NanInfFinding]:
        """The light step's findings: one stack and one host read of every screen (``keep``: the
        module outputs' screens stay for the step's end, as for :meth:`check` mid-step)."""
        outs = self._light_outs
        if not keep:
            self._light_outs = []
        if self._light_before is None and not outs:  # the step never began (stop() right after a step)
            return []
        before_names, before = self._light_before or ([], [])
        params = self._light_params()
        grads = [(n, p.grad) for n, p in params if p.grad is not None]
        grads = [(n, g) for n, g in grads if _floats([g])]
        values = [(n, p) for n, p in params if _floats([p])]
        with tool_work(), torch.no_grad():
            screens = [o[3] for o in outs] + _screens([g for _, g in grads]) + _screens([p.detach() for _, p in values]) \
                + before
            if not screens:
                return []
            dev = screens[0].device
            read = torch.stack([s if s.device == dev else s.to(dev, non_blocking=True) for s in screens]).tolist()
        mod_vals = read[:len(outs)]
        grad_vals = read[len(outs):len(outs) + len(grads)]
        param_vals = read[len(outs) + len(grads):len(outs) + len(grads) + len(values)]
        before_vals = read[len(read) - len(before):]
        # the sinks: the model's output and the parameters after the step. Non-finite gradients
        # alone are not: a GradScaler (fp16 AMP) skips the optimizer step they overflow, by design
        sink = next((_bad(v) for o, v in zip(outs, mod_vals) if o[0] == "" and _bad(v)), None) \
            or next((_bad(v) for v in param_vals if _bad(v)), None)
        if sink is None:  # nothing non-finite reached a sink (an absorbed mask, a skipped step, or all finite)
            return []
        step = self.current_step
        for name, v in zip(before_names, before_vals):
            value = _bad(v)
            if value:  # it entered with the parameters: no op of this step made it
                return [NanInfFinding(kind="light", name=f"parameter {name}{BEFORE_STEP}", op="",
                                      module=name.rpartition(".")[0], module_class=None, phase="forward", step=step,
                                      seq=-1, value=value)]
        bad_mods = [(o[0], o[1], o[2], _bad(v)) for o, v in zip(outs, mod_vals) if _bad(v)]
        # the first module output holding what reached the sink (NaN, else Inf), else the first any
        hit = next((m for m in bad_mods if m[3] == sink), None) or (bad_mods[0] if bad_mods else None)
        if hit is not None:
            path, cls, call, value = hit
            return [NanInfFinding(kind="light", name=module_record_name(path, cls or "", "forward", call), op="", module=path,
                                  module_class=cls, phase="forward", step=step, seq=-1, value=value)]
        for phase, named, vals in (("backward", grads, grad_vals), ("optimizer", values, param_vals)):
            for (name, _), v in zip(named, vals):
                value = _bad(v)
                if value:
                    what = "gradient of" if phase == "backward" else "parameter"
                    module = name.rpartition(".")[0]
                    return [NanInfFinding(kind="light", name=f"{what} {name}", op="", module=module,
                                          module_class=None, phase=phase, step=step, seq=-1, value=value)]
        return []  # pragma: no cover - a bad sink is one of the above
