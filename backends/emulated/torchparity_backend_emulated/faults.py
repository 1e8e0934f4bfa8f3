"""Fault specifications for the emulated device: which op output to perturb, where and when.

A :class:`Fault` names an op by pattern (fnmatch, matched against the overload packet name such
as ``mul``, the qualified packet ``aten.mul`` and the overload ``aten.mul.Tensor``), optionally a
module path pattern (``layers.1.mlp``, ``layers.*.mlp``), a phase, the step, and the call index
among the matching calls of that step. This module imports without torch.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from torchparity.errors import PluginError

PHASES = ("forward", "backward", "optimizer", "recompute")
KINDS = ("scale", "add", "nan", "inf")


@dataclass
class Fault:
    """One planted fault.

    Attributes:
        op: fnmatch pattern for the op (``mul``, ``aten.mul*``, ``aten.mm.default``).
        module: fnmatch pattern for the module path (``None``: any module). In backward the
            module is the one whose forward created the autograd node being run.
        phase: ``forward``, ``backward``, ``optimizer`` or ``recompute`` (``None``: any phase).
        call: the call index *as the dump names it*: ``Fault(op="aten.mm", phase="forward",
            call=3)`` corrupts the op recorded as ``Aten.mm.3.forward`` of that step. The count is
            per op (overload packet) and phase within a step, views included, like the dump's
            aten records (``None``: every matching call). ``module`` filters on top of it.
            Default: every matching call when ``module`` is given (the module singles the op
            out), else 0 (the step's first call).
        step: the step (0-based; advanced by ``optimizer.step()`` or ``backend.step()``) in which
            the fault fires (``None``: every step).
        kind: ``scale`` (multiply by ``factor``), ``add`` (add ``value``), ``nan`` or ``inf``.
        factor: multiplier for ``scale``.
        value: addend for ``add``.
        index: flat element index to corrupt (``None``: every element of the output).
        output: which (flattened) tensor output to perturb.
    """

    op: str
    module: str | None = None
    phase: str | None = "forward"
    call: int | None = "auto"  # type: ignore[assignment]  # resolved in __post_init__
    step: int | None = 0
    kind: str = "scale"
    factor: float = 1.05
    value: float = 0.0
    index: int | None = None
    output: int = 0

    def __post_init__(self) -> None:
        if self.call == "auto":
            # A module pattern already singles the op out: fire on its calls in that module.
            # Without one, the first call of the step (the dump's counter 0).
            self.call = None if self.module is not None else 0
        if not isinstance(self.op, str) or not self.op:
            raise PluginError("emulated fault: 'op' must be a non-empty pattern such as 'mul' or 'aten.mm*'")
        if self.phase is not None and self.phase not in PHASES:
            raise PluginError(f"emulated fault: phase must be one of {', '.join(PHASES)} or null, got {self.phase!r}")
        if self.kind not in KINDS:
            raise PluginError(f"emulated fault: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("call", "step", "index"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise PluginError(f"emulated fault: {name} must be a non-negative integer or null, got {v!r}")
        if not isinstance(self.output, int) or self.output < 0:
            raise PluginError(f"emulated fault: output must be a non-negative integer, got {self.output!r}")

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any] | Fault) -> Fault:
        """Build a fault from a plugins.yaml mapping (unknown keys are rejected by name)."""
        if isinstance(spec, Fault):
            return spec
        if not isinstance(spec, Mapping):
            raise PluginError(f"emulated fault: expected a mapping like {{op: mul, kind: scale}}, got {spec!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(spec) - known)
        if unknown:
            raise PluginError(f"emulated fault: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**dict(spec))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def matches_op(self, base: str, qualified: str, overload: str) -> bool:
        """``base`` = ``mm``, ``qualified`` = ``aten.mm``, ``overload`` = ``aten.mm.default``."""
        return any(fnmatch.fnmatchcase(n, self.op) for n in (base, qualified, overload))

    def matches_where(self, module: str, phase: str, step: int) -> bool:
        if self.phase is not None and phase != self.phase:
            return False
        if self.step is not None and step != self.step:
            return False
        if self.module is not None and not fnmatch.fnmatchcase(module, self.module):
            return False
        return True


@dataclass
class Injection:
    """What was injected: the record tests and demos assert on."""

    fault: int  # index into the backend's fault list
    op: str
    module: str
    phase: str
    step: int
    call: int
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
