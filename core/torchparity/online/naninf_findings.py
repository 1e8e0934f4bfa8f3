"""What :class:`~torchparity.online.naninf.NanInfTracker` reports: findings and the error."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import TorchparityError

#: greppable marker of every finding in the log
MARKER = "[torchparity:NANINF]"
#: the end of a light finding's name when the parameters held the NaN/Inf as the step began
BEFORE_STEP = " at the step's start"
#: why an overflow of the scaled backward is absorbed (``NanInfFinding.note``)
SCALER_NOTE = "absorbed by the loss scaler: a GradScaler checked these gradients and skips the optimizer step they overflow"
#: where an entered NaN/Inf may come from once torch.compile'd code has run in the process
#: (``NanInfFinding.note``; docs/compile.md)
COMPILED_NOTE = ("torch.compile'd code has run in this process: the NaN/Inf may have been made inside a compiled "
                 "function's or module's fused kernels, which the tracker does not see (to name the op: "
                 "torchparity.dump(DIR, model=model, level='aten') captures compiled models' and compiled blocks' "
                 "graphs; or run that code uncompiled)")


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
    the loss, a gradient, a parameter, optimizer state or the model's output, or one made in the
    backward of a step whose gradients a GradScaler checked (``note`` says so: fp16 AMP skips the
    optimizer step of an overflowing scaled backward and lowers the scale, by design).

    ``"light"``: on a light step (``light="module"``, no op tracked) a NaN/Inf reached a sink;
    ``name`` says where it was first seen (a module output as the module-level dump names it,
    ``Module.layers.1.mlp.MLP.forward.0``; ``gradient of fc.weight``; ``parameter fc.weight``),
    ``op`` is empty, ``seq`` is -1, and the next step is tracked op by op.
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
    note: str = ""  # absorbed for an unusual reason (SCALER_NOTE); entered maybe from compiled code (COMPILED_NOTE)

    def __str__(self) -> str:
        where = f"in module {self.module!r}" + (f" ({self.module_class})" if self.module_class else "") \
            if self.module else "outside any module"
        if self.kind == "light":
            if self.name.endswith(BEFORE_STEP):
                return (f"step {self.step} (light tier, no op tracked): the {self.name} already held {self.value} "
                        f"(it came from an earlier step, with the parameters)")
            if self.phase == "forward":
                seen = (f"in the output of module {self.module!r}" + (f" ({self.module_class})" if self.module_class else "")
                        if self.module else "in the model's output") + f" ({self.name})"
            else:
                seen = f"in the {self.name}" + (" after the optimizer step" if self.phase == "optimizer" else "")
            return (f"step {self.step} (light tier, no op tracked): {self.value} reached the loss, a gradient or a "
                    f"parameter; first seen {seen}. The next step is tracked op by op; if it does not come again "
                    f"there, run step {self.step} again with NanInfTracker(model, steps=[{self.step}]) to name the op "
                    f"that creates it")
        if self.kind == "created":
            what = f"produced {self.value} from finite inputs"
        elif self.kind == "absorbed":
            what = f"produced {self.value} from finite inputs; " + (self.note or "absorbed (it reached no loss, "
                                                                    "gradient, parameter or model output)")
        else:
            what = f"read a tensor that already held {self.value} (no tracked op created it in this step)" + \
                (f"; {self.note}" if self.note else "")
        return f"step {self.step}: {self.name} ({self.op}) {where}, {self.phase}: {what}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
