"""The bisect's result: ``bisect-report.json`` and the human summary."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError


@dataclass
class BisectReport:
    """What a bisect found (written as ``bisect-report.json``).

    ``verdict``: ``culprit`` (a promoted set removes the divergence: ``culprit_modules`` /
    ``culprit_ops``), ``no_divergence`` (the target is within tolerance: nothing to bisect) or
    ``not_precision`` (promoting everything does not remove it: not a precision problem, or, with
    ``promote_backend``, not a problem of how the device computes ops) or
    ``diffuse`` (more than ``max_culprits`` modules or ops are needed: the divergence is spread over
    many of them; ``culprit_modules`` / ``culprit_ops`` hold those found, which do not suffice).
    """

    verdict: str
    script: str
    entry: str
    step: int
    target: str
    promote_dtype: str
    tolerance: float
    baseline_error: float
    error_after_promotion: float | None = None
    culprit_modules: list[str] = field(default_factory=list)
    culprit_ops: list[str] = field(default_factory=list)
    reruns: int = 0
    runs_total: int = 0
    n_modules: int = 0
    n_ops: int = 0
    path: list[dict] = field(default_factory=list)
    compare_root_cause: dict | None = None
    seed: int = 0
    promote_backend: str | None = None  # promoted ops computed on this backend instead of in promote_dtype
    #: ops a re-run chose to promote that ran unpromoted after all (record name -> calls, over all
    #: re-runs): the reference could not run them, or their kernel refused the upcast inputs
    not_promoted: dict = field(default_factory=dict)

    @property
    def promoted_to(self) -> str:
        """What promotion means in this bisect, for the summary."""
        return f"the {self.promote_backend} backend" if self.promote_backend else self.promote_dtype

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compare_agreement"] = self.compare_agreement
        for k in ("baseline_error", "error_after_promotion"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = "Infinity" if v > 0 else "NaN"
        for p in d["path"]:
            if isinstance(p.get("error"), float) and not math.isfinite(p["error"]):
                p["error"] = "Infinity"
        return d

    def write(self, output_dir: str | Path) -> Path:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "bisect-report.json"
        tmp = out / ".bisect-report.json.tmp"
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(path)
        return path

    def summary(self) -> str:
        """A few lines for a person."""
        head = (f"bisect {self.script}:{self.entry} step {self.step}, target {self.target} vs reference, "
                f"tolerance {self.tolerance:.3g} (relative L2 error of the step's outputs)")
        lines = [head, f"baseline error {self.baseline_error:.4g}"]
        if self.verdict == "no_divergence":
            lines.append("no divergence to bisect: the target run is within tolerance")
        elif self.verdict == "not_precision":
            lines.append(f"promoting every op to {self.promoted_to} leaves error {self.error_after_promotion:.4g}: "
                         f"not a problem of how ops compute (no culprit)")
            if not self.promote_backend:
                lines.append("(a device kernel that computes wrongly is not removed by a higher precision: "
                             "--promote-backend cpu computes the promoted ops on the reference instead)")
            if self.target == "native" and not self.promote_backend:
                lines.append("(native target: promoted ops cast back to the 16-bit dtype, so what the tensors store "
                             "-- inputs, parameters, activations -- stays rounded; on the CPU, bf16 kernels already "
                             "accumulate in float32)")
        elif self.verdict == "diffuse":
            what = "ops" if self.culprit_ops else "modules"
            found = self.culprit_ops or [m or "(top level)" for m in self.culprit_modules]
            lines.append(f"no small culprit set: {len(found)} {what} found one by one ({'; '.join(found[:8])}"
                         f"{'; ...' if len(found) > 8 else ''}) and promoting them together leaves error "
                         f"{self.error_after_promotion:.4g}: the divergence is spread over many {what} (each "
                         f"one's rounding adds up), not one culprit; raise --max-culprits to search on, or "
                         f"compare the per-module errors of a dump")
        else:
            lines.append(f"culprit module(s): {', '.join(m or '(top level)' for m in self.culprit_modules)}")
            lines.append(f"culprit op(s): {'; '.join(self.culprit_ops)}")
            lines.append(f"promoting them to {self.promoted_to}: error {self.error_after_promotion:.4g} "
                         f"(within tolerance) -- proven by re-run")
        if self.not_promoted:
            shown = "; ".join(list(self.not_promoted)[:4]) + ("; ..." if len(self.not_promoted) > 4 else "")
            lines.append(f"{len(self.not_promoted)} op(s) chosen for promotion ran unpromoted (could not be "
                         f"promoted: {shown}); the re-runs' verdicts hold for what ran")
        lines.append(f"re-runs: {self.reruns} (+ reference and baseline: {self.runs_total} runs in all; "
                     f"{self.n_modules} modules, {self.n_ops} ops searched)")
        rc = self.compare_root_cause
        if rc:
            agree = {"confirmed": " -- among the bisect's culprit ops: confirmed by experiment",
                     "differs": " -- NOT among the bisect's culprit ops"}.get(self.compare_agreement or "", "")
            lines.append(f"compare's root cause: {rc.get('name')} in {rc.get('module') or '(top level)'}, "
                         f"{rc.get('phase')}, step {rc.get('step')}{agree}")
        return "\n".join(lines)

    @property
    def compare_agreement(self) -> str | None:
        """``confirmed`` when the compare's root cause is one of the culprit ops (same record name and
        module), ``differs`` when there is a culprit but not it, None otherwise."""
        rc = self.compare_root_cause
        if not rc or self.verdict != "culprit":
            return None
        me = f"{rc.get('module') or '(top level)'}: {rc.get('name')}"
        return "confirmed" if me in self.culprit_ops else "differs"


def compare_root_cause(compare_dir: str | Path) -> dict | None:
    """The root cause of a compare output directory (its ``compare.json``), or None when it has none."""
    path = Path(compare_dir) / "compare.json"
    if not path.is_file():
        raise UsageError(f"bisect: --compare {str(compare_dir)!r} has no compare.json; give the output directory "
                         f"of 'torchparity compare ... -o DIR' (json reporter)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"bisect: {str(path)!r} is not readable JSON ({exc}); re-run the compare") from None
    rc = data.get("root_cause") if isinstance(data, dict) else None
    if rc is None:
        return None
    return {k: rc.get(k) for k in ("name", "op", "module", "phase", "step", "rank", "reason") if k in rc}
