"""msprobe's gradient probe (seed 004) over :class:`torchparity.gradients.GradMonitor`.

``config.json``::

    {"task": "grad_probe", "dump_path": "./dump_path", "rank": [], "step": [],
     "grad_probe": {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}}

``PrecisionDebugger(config_path).monitor(model)`` starts a ``GradMonitor(model, dump_path,
optimizer="any", level=grad_level, bounds=bounds, params=param_list (exact names), steps=step,
layout="msprobe")`` on the ranks of ``rank`` (every rank when empty): one step per optimizer
call, the seed's ``rank{R}/grad_summary_{S}.csv`` and ``rank{R}/step{S}/{param}.npy`` files (plus
torchparity's own ``grads.json`` and ``rank{R}/step*.safetensors``, which ``torchparity grads``
compares). :class:`GradComparator` compares two such dumps.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError

log = logging.getLogger("torchparity")

__all__ = ["GradComparator", "grad_probe_settings", "start_grad_probe"]

_TOP_KEYS = {"task", "dump_path", "rank", "step", "grad_probe", "seed", "is_deterministic", "level"}
_SECTION_KEYS = {"grad_level", "param_list", "bounds"}


def grad_probe_settings(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """Validate a ``grad_probe`` config; the GradMonitor arguments it maps to (plus ``ranks``)."""
    from ..dump.options import _ranges
    from ..gradients.sketch import DEFAULT_BOUNDS, LEVELS, check_bounds

    unknown = sorted(set(cfg) - _TOP_KEYS)
    if unknown:
        raise UsageError(f"{source}: unknown key(s) {', '.join(unknown)} for task grad_probe; known: {', '.join(sorted(_TOP_KEYS))}")
    section = cfg.get("grad_probe") or {}
    if not isinstance(section, dict):
        raise UsageError(f"{source}: 'grad_probe' must be an object with grad_level, param_list, bounds")
    unknown = sorted(set(section) - _SECTION_KEYS)
    if unknown:
        raise UsageError(f"{source}: unknown key(s) {', '.join(unknown)} in 'grad_probe'; known: {', '.join(sorted(_SECTION_KEYS))}")
    level = section.get("grad_level", "L1")
    if level not in LEVELS:
        raise UsageError(f"{source}: grad_level must be one of {', '.join(LEVELS)} (got {level!r})")
    params = section.get("param_list") or []
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise UsageError(f"{source}: param_list must be a list of parameter names")
    try:
        bounds = check_bounds(section.get("bounds", list(DEFAULT_BOUNDS)), "bounds")
    except ValueError as exc:
        raise UsageError(f"{source}: {exc}") from None
    dump_path = cfg.get("dump_path")
    if not isinstance(dump_path, str) or not dump_path:
        raise UsageError(f"{source}: 'dump_path' (the output directory) is required for task grad_probe")
    if Path(dump_path).exists() and not Path(dump_path).is_dir():
        raise UsageError(f"{source}: dump_path {dump_path} exists and is not a directory")
    return {"output_dir": dump_path, "level": level, "bounds": bounds, "params": params or None,
            "steps": _ranges(cfg.get("step"), "step"), "ranks": _ranges(cfg.get("rank"), "rank")}


def start_grad_probe(model: Any, settings: dict[str, Any]) -> Any:
    """Start the GradMonitor of ``settings`` on ``model``; None when this rank is not selected."""
    import torch

    from ..capture.ranks import current_rank
    from ..gradients.monitor import GradMonitor

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"PrecisionDebugger.monitor needs the model (a torch.nn.Module), got {type(model).__name__}")
    rank = current_rank()
    if settings["ranks"] is not None and rank not in settings["ranks"]:
        log.info("msprobe grad_probe: rank %s is not in 'rank' %s; not monitored", rank, settings["ranks"])
        return None
    wanted = settings["params"]
    if wanted:
        names = {n for n, _ in model.named_parameters()}
        missing = [p for p in wanted if p not in names]
        if missing:
            log.warning("msprobe grad_probe: param_list name(s) not in the model, ignored: %s", ", ".join(missing[:5]))
    mon = GradMonitor(model, settings["output_dir"], optimizer="any", params=wanted, match="exact",
                      level=settings["level"], bounds=settings["bounds"], steps=settings["steps"], rank=rank,
                      layout="msprobe")
    return mon.start()


class GradComparator:
    """msprobe's ``GradComparator``: direction similarity of two gradient-probe dumps."""

    @classmethod
    def compare_distributed(cls, dump_path1: str | os.PathLike[str], dump_path2: str | os.PathLike[str],
                            output_path: str | os.PathLike[str]) -> dict[str, Any]:
        """Per rank and step, the similarity of each parameter's gradient direction (fraction of
        elements whose sign agrees) and their numel-weighted mean (``summary``):
        ``output_path[/rank{R}]/similarities.csv`` and ``similarities_picture/{param}.png``,
        ``summary_similarities.png``. The ``rank{R}`` level is left out when both dumps hold one
        rank. Returns ``{"tables": {rank: DataFrame}, "files": [...], "warnings": [...]}``."""
        from ..gradients.msprobe_layout import compare_dirs

        res = compare_dirs(dump_path1, dump_path2, output_path)
        for w in res["warnings"]:
            log.warning("msprobe GradComparator: %s", w)
        return res

    compare = compare_distributed
