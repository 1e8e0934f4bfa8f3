"""The built-in demo: find a planted divergence in a small transformer, on the CPU.

1. Train a small Llama-like model (:mod:`torchparity.toymodels`) for a few steps on the CPU
   reference backend and dump it (the *benchmark*).
2. Train the same model, from the same weights and batches, on the **emulated** device with one
   planted fault (one op's output scaled by a small factor, at one step) and dump it (the
   *device under test*). The emulated device is the CPU pretending to be a faulty accelerator; it
   is not hardware.
3. Compare the two dumps and check that the op torchparity names as the root cause is the one
   that was planted.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import UsageError


@dataclass
class DemoFault:
    """Where the demo plants its fault (an aten op, by its dump name)."""

    op: str = "aten.mm"
    module: str = "layers.1.mlp.down_proj"
    phase: str = "forward"
    step: int = 1
    factor: float = 1.05

    def describe(self) -> str:
        return (f"{self.op} in {self.module} ({self.phase}, step {self.step}): "
                f"output scaled by {self.factor:g}")


@dataclass
class DemoResult:
    out_dir: Path
    fault: DemoFault
    result: Any  # CompareResult
    found: bool
    seconds: float
    losses: dict[str, list[float]] = field(default_factory=dict)


#: dump levels that record aten ops; the others (module, api, mix) see the planted aten op only
#: through the call that contains it (``torch.nn.functional.linear``, the ``Linear`` module)
ATEN_LEVELS = ("aten",)


def is_planted(rc: Any, fault: DemoFault, level: str) -> bool:
    """Whether the root cause ``rc`` (a :class:`~torchparity.results.Suspect` or None) is the
    planted fault, as far as a dump at ``level`` can see it.

    At aten level it must be the planted aten op itself (``aten.mm.default`` for ``aten.mm``) in
    the planted module. The module, api and mix levels record no aten op: the finest record
    that contains the planted op is a call made in the planted module (its ``Linear`` module
    record, the ``functional.linear`` call inside it), which is what they can name.
    Phase and step must match at every level.
    """
    if rc is None or rc.phase != fault.phase or rc.step != fault.step or rc.module != fault.module:
        return False
    if level in ATEN_LEVELS or getattr(rc, "level", "") == "aten":
        return fault.op.split(".")[-1] in str(rc.op).split(".")
    return True


def _emulated() -> Any:
    try:
        import torchparity_backend_emulated as emulated
    except ImportError as exc:
        raise UsageError("the demo needs the emulated device backend: pip install ./backends/emulated "
                         "(from the torchparity repository)") from exc
    return emulated


def run_demo(out_dir: str | Path = "torchparity-demo", steps: int = 2, level: str = "aten",
             fault: DemoFault | None = None, formats: str = "json,xlsx,advisor",
             say: Callable[[str], None] = print) -> DemoResult:
    """Run the demo; ``say`` receives progress lines. Returns what was found."""
    import torch

    import torchparity
    from .toymodels import make_batches, make_model, train

    emulated = _emulated()
    fault = fault or DemoFault()
    if not 0 <= fault.step < steps:
        raise UsageError(f"the fault's step ({fault.step}) must be below --steps ({steps})")
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    losses: dict[str, list[float]] = {}

    say(f"1/3  benchmark: {steps} training steps on the CPU reference, dumped at {level} level")
    torch.manual_seed(0)
    model, batches = make_model(), make_batches(steps)
    with torchparity.dump(str(out / "bench"), level=level, backend="cpu"):
        losses["bench"] = train(model, batches)

    say(f"2/3  device:    the same steps on the EMULATED device with a planted fault:\n"
        f"                {fault.describe()}")
    torch.manual_seed(0)
    model, batches = make_model(), make_batches(steps)
    planted = emulated.Fault(op=fault.op, module=fault.module, phase=fault.phase, step=fault.step,
                             call=None, kind="scale", factor=fault.factor)
    with emulated.emulate(faults=[planted]):
        with torchparity.dump(str(out / "device"), level=level):
            losses["device"] = train(model, batches)

    say("3/3  compare:   device dump vs benchmark dump")
    result = torchparity.compare(str(out / "device"), str(out / "bench"), output_dir=str(out / "report"),
                                 formats=formats)
    found = is_planted(result.root_cause, fault, level)
    return DemoResult(out_dir=out, fault=fault, result=result, found=found,
                      seconds=time.perf_counter() - t0, losses=losses)
