"""On-disk layout of a gradient run, written by :class:`~torchparity.gradients.GradMonitor`::

    RUN/grads.json                       header: format, version, sketch kind/dim/seed, stats names
    RUN/rank{R}/step{S:07d}.safetensors  one file per recorded step and rank:
        tensor "stats"  (P, len(STATS)) float64   exact statistics per parameter
        tensor "sketch" (P, sketch_dim) float32   direction sketch per parameter
        tensor "param_stats", "param_sketch"      the same for the parameter values the gradient
                                                  was computed with (optional)
        metadata: step, rank, params (JSON list of names, in model order), shapes, dtypes

Each step file is written to a temporary name and renamed into place, so a killed run leaves
every completed step readable. Reading never unpickles anything (JSON + safetensors).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DumpError, UsageError
from .sketch import SKETCH_KIND, STATS

FORMAT_NAME = "torchparity-grads"
FORMAT_VERSION = 1
HEADER = "grads.json"
_STEP_RE = re.compile(r"^step(\d+)\.safetensors$")
_RANK_RE = re.compile(r"^rank(\d+)$")


def step_path(root: Path, rank: int, step: int) -> Path:
    return Path(root) / f"rank{int(rank)}" / f"step{int(step):07d}.safetensors"


def write_header(root: Path, sketch_dim: int, seed: int, extra: dict[str, Any] | None = None) -> None:
    import torch

    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "sketch": SKETCH_KIND, "sketch_dim": int(sketch_dim),
           "seed": int(seed), "stats": list(STATS), "torch_version": torch.__version__}
    doc.update(extra or {})
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / (HEADER + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, root / HEADER)


def write_step(root: Path, rank: int, step: int, names: list[str], shapes: list[list[int]], dtypes: list[str],
               stats: Any, sketch: Any, param_stats: Any = None, param_sketch: Any = None, *,
               dist: Any = None, md5: list[str] | None = None) -> Path:
    """Write one step atomically (``stats``/``sketch`` are CPU tensors). ``dist`` (level L2): the
    value distribution over the run's bounds, one row per parameter; ``md5`` (level L0): the MD5
    of each gradient."""
    from safetensors.torch import save_file

    path = step_path(root, rank, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    meta = {"step": str(step), "rank": str(rank), "params": json.dumps(names), "shapes": json.dumps(shapes),
            "dtypes": json.dumps(dtypes)}
    tensors = {"stats": stats.contiguous(), "sketch": sketch.contiguous()}
    if param_stats is not None and param_sketch is not None:
        tensors.update(param_stats=param_stats.contiguous(), param_sketch=param_sketch.contiguous())
    if dist is not None:
        tensors["dist"] = dist.contiguous()
    if md5 is not None:
        meta["md5"] = json.dumps(md5)
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


@dataclass
class StepData:
    step: int
    rank: int
    params: list[str]
    shapes: list[list[int]]
    stats: Any  # numpy (P, len(STATS)) float64
    sketch: Any  # numpy (P, k)
    param_stats: Any = None  # numpy (P, len(STATS)) or None
    param_sketch: Any = None  # numpy (P, k) or None
    dist: Any = None  # numpy (P, len(bounds) + 1) value distribution (level L2) or None
    md5: list[str] | None = None  # MD5 per gradient (level L0) or None


@dataclass
class GradRun:
    """A gradient run directory: its header and the (rank, step) files it holds."""

    path: Path
    header: dict[str, Any]
    files: dict[tuple[int, int], Path] = field(default_factory=dict)  # (rank, step) -> file

    @property
    def ranks(self) -> list[int]:
        return sorted({r for r, _ in self.files})

    def steps(self, rank: int) -> list[int]:
        return sorted(s for r, s in self.files if r == rank)

    def read(self, rank: int, step: int) -> StepData:
        """One step's data; :class:`DumpError` naming the file when it is unreadable."""
        from safetensors import safe_open

        path = self.files[(rank, step)]
        try:
            with safe_open(str(path), framework="np") as f:
                meta = f.metadata() or {}
                stats, sketch = f.get_tensor("stats"), f.get_tensor("sketch")
                keys = set(f.keys())
                pstats = f.get_tensor("param_stats") if "param_stats" in keys else None
                psketch = f.get_tensor("param_sketch") if "param_sketch" in keys else None
                dist = f.get_tensor("dist") if "dist" in keys else None
            params = json.loads(meta["params"])
            shapes = json.loads(meta.get("shapes", "[]"))
            md5 = json.loads(meta["md5"]) if "md5" in meta else None
            if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
                raise ValueError("'params' is not a list of names")
            if md5 is not None and (not isinstance(md5, list) or len(md5) != len(params)):
                raise ValueError("'md5' is not one string per parameter")
        except Exception as exc:
            raise DumpError(f"{path}: unreadable gradient step file ({type(exc).__name__}: {exc}); "
                            "delete it or record the run again") from None
        if stats.shape != (len(params), len(STATS)) or sketch.shape[0] != len(params):
            raise DumpError(f"{path}: inconsistent gradient step file (stats {stats.shape}, sketch {sketch.shape}, "
                            f"{len(params)} parameters)")
        if dist is not None and dist.shape[0] != len(params):
            raise DumpError(f"{path}: inconsistent gradient step file (dist {dist.shape}, {len(params)} parameters)")
        return StepData(step, rank, params, shapes, stats, sketch, pstats, psketch, dist, md5)


def load_run(path: str | os.PathLike[str]) -> GradRun:
    """Open a directory written by :class:`~torchparity.gradients.GradMonitor`.

    Raises :class:`UsageError` when ``path`` is not such a directory (with what it is instead).
    """
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such directory (expected a gradient run written by torchparity.GradMonitor)")
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory (expected a gradient run written by torchparity.GradMonitor)")
    hp = root / HEADER
    if not hp.is_file():
        hint = " (it looks like a dump: compare dumps with `torchparity compare`)" if (root / "torchparity.json").exists() else ""
        raise UsageError(f"{root}: no {HEADER}; not a gradient run written by torchparity.GradMonitor{hint}")
    try:
        header = json.loads(hp.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DumpError(f"{hp}: unreadable header ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise UsageError(f"{hp}: not a torchparity gradient run header (format is not '{FORMAT_NAME}')")
    if int(header.get("version", 0)) > FORMAT_VERSION:
        raise UsageError(f"{hp}: version {header.get('version')} is newer than this torchparity reads "
                         f"({FORMAT_VERSION}); upgrade torchparity")
    run = GradRun(root, header)
    for d in root.iterdir():
        m = _RANK_RE.match(d.name)
        if not m or not d.is_dir():
            continue
        for f in d.iterdir():
            ms = _STEP_RE.match(f.name)
            if ms:
                run.files[(int(m.group(1)), int(ms.group(1)))] = f
    return run
