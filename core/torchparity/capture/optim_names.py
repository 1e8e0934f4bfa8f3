"""Which parameter an optimizer op updates: ``flags.param`` (``flags.params`` for ``_foreach_*``).

A fault in the optimizer update used to be found at the right op and step but without saying
which parameter it touched: at the aten level ``addcdiv_`` or ``_foreach_addcdiv_`` only sees
tensors. At each ``optimizer.step()`` this names, by storage, every parameter of the optimizer's
groups (its path in the models the module tracker knows), its gradient and its optimizer state
(``exp_avg``, ``exp_avg_sq``, ``step``...); the intermediates an op derives from them (``denom =
exp_avg_sq.sqrt() / ...``) inherit the name. Foreach ops get one name per list element.
"""

from __future__ import annotations

from typing import Any

import torch

from .compiled import eager_hook
from .module_tracker import ModuleTracker
from .ops import storage_ptr
from .tensor_memo import TensorMemo


class OptimizerParamNames:
    """Names parameters, their gradients and optimizer state during ``optimizer.step()``."""

    def __init__(self, tracker: ModuleTracker) -> None:
        self.tracker = tracker
        self._by_ptr: dict[int, str] = {}  # storages alive for the whole step: params, grads, state
        self._derived = TensorMemo()  # intermediates of this step -> the parameter they derive from
        self._handle: Any = None

    def start(self) -> None:
        import torch.optim.optimizer as optim_mod

        self._handle = optim_mod.register_optimizer_step_pre_hook(eager_hook(self._on_step))
        # an optimizer hook added later runs after the tracker's roots are known (first forward)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _param_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for root in list(self.tracker._roots):
            prefix = self.tracker._names.get(root, "")
            for n, p in root.named_parameters():
                names.setdefault(id(p), f"{prefix}.{n}" if prefix else n)
        return names

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        names = self._param_names()
        self._by_ptr.clear()
        self._derived.clear()
        state = getattr(optimizer, "state", {})
        for group in getattr(optimizer, "param_groups", []):
            for p in group.get("params", []):
                name = names.get(id(p))
                if name is None:
                    continue
                tensors = [p, p.grad] + [v for v in state.get(p, {}).values() if isinstance(v, torch.Tensor)]
                for t in tensors:
                    if isinstance(t, torch.Tensor) and t.numel():
                        ptr = storage_ptr(t)
                        if ptr:
                            self._by_ptr.setdefault(ptr, name)

    def name_of(self, t: Any) -> str | None:
        if not isinstance(t, torch.Tensor):
            return None
        name = self._derived.get(t)
        if name is None and self._by_ptr and t.numel():
            name = self._by_ptr.get(storage_ptr(t))
        return name

    def flags(self, args: tuple, kwargs: dict, outputs: Any) -> dict[str, Any]:
        """``{"param": name}`` or ``{"params": [name per list element]}`` for one optimizer op
        (empty if none of its tensors is known); its outputs inherit the name(s)."""
        if not self._by_ptr:
            return {}
        values = list(args) + list(kwargs.values())
        lists = [v for v in values if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor)]
        if lists:
            per = [None] * len(lists[0])
            for lst in lists:
                for i, t in enumerate(lst[:len(per)]):
                    per[i] = per[i] or self.name_of(t)
            if isinstance(outputs, (list, tuple)) and len(outputs) == len(per):
                for t, n in zip(outputs, per):
                    if n is not None and isinstance(t, torch.Tensor):
                        self._derived[t] = n
            return {"params": per} if any(per) else {}
        name = next((n for n in (self.name_of(v) for v in values) if n is not None), None)
        if name is None:
            return {}
        for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs]):
            if isinstance(t, torch.Tensor):
                self._derived[t] = name
        return {"param": name}
