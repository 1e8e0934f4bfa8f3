"""Manual node matches: the file the page exports and ``torchparity graph --match-file`` reads.

A match pairs a node found on the device side only with one found on the bench side only::

    {"format": "torchparity-matches", "version": 1, "step": 0, "rank": 0,
     "modules": {"layers.0.mlp.down_proj": "layers.0.mlp.down_projX"},
     "records": {"Functional.linear.13.forward": "Functional.linear.14.forward"}}

``modules`` (device module path -> bench module path) join the layer mapping, so
:func:`torchparity.compare` pairs and judges the records under them. ``records`` (device record
name -> bench record name) pair two unmatched records that compare could not pair; their
statistics are compared with compare's own statistic metrics and shown (precision index, relative
differences), but they get no verdict: a manual pair is never counted as a pass.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError

FORMAT = "torchparity-matches"
STATS = ("max", "min", "mean", "norm")


@dataclass
class Matches:
    """Manual matches: module paths and record names, device -> bench."""

    modules: dict[str, str] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)
    source: str = "matches"

    def to_dict(self, step: int | None = None, rank: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "version": 1}
        if step is not None:
            out["step"], out["rank"] = step, rank
        out["modules"], out["records"] = dict(self.modules), dict(self.records)
        return out


def _pairs(data: Any, key: str, where: str) -> dict[str, str]:
    v = data.get(key, {})
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(a, str) and isinstance(b, str) and a and b
                                          for a, b in v.items()):
        raise UsageError(f"{where}: '{key}' must be an object of \"device name\": \"bench name\" strings; "
                         "export the file again from graph.html")
    return dict(v)


def load_matches(matches: str | os.PathLike[str] | Mapping[str, Any] | Matches | None) -> Matches:
    """Matches from a match file (JSON, as the page exports it), a dict of the same shape or a
    :class:`Matches`. Raises :class:`UsageError` (one line, naming the file) on anything else."""
    if matches is None:
        return Matches()
    if isinstance(matches, Matches):
        return matches
    if isinstance(matches, Mapping):
        data: Any = dict(matches)
        where = "matches"
    else:
        p = Path(matches)
        where = f"match file {p}"
        if not p.is_file():
            raise UsageError(f"{where} does not exist or is not a file; export it from graph.html "
                             "(\"export matches\")")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"{where} is not valid JSON ({msg}); export it again from graph.html") from None
        except OSError as exc:
            raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be a JSON object with 'modules' and/or 'records'; "
                         "export it again from graph.html")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise UsageError(f"{where} has format {fmt!r}, expected {FORMAT!r}; export it again from graph.html")
    return Matches(modules=_pairs(data, "modules", where), records=_pairs(data, "records", where), source=where)


def _arr(tensors: list[dict[str, Any]], stat: str) -> Any:
    import numpy as np

    out = []
    for t in tensors:
        v = t.get(stat)
        if isinstance(v, str) and v in ("Infinity", "-Infinity", "NaN"):
            v = float(v.replace("Infinity", "inf"))
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan)
    return np.array(out, dtype="float64")


def _numel(shape: Any) -> float:
    if isinstance(shape, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in shape):
        return float(math.prod(shape))
    return math.nan


def manual_metrics(dev: list[dict[str, Any]], bench: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Compare rows for two manually paired records: tensors paired by (io, arg), statistic
    differences from :func:`torchparity.compare.metrics.stat_metrics`. No verdict is given."""
    import numpy as np

    from ..compare.metrics import stat_metrics
    from .model import jsonable

    bmap = {(t.get("io"), str(t.get("arg"))): t for t in bench}
    pairs = [(d, bmap[(d.get("io"), str(d.get("arg")))]) for d in dev if (d.get("io"), str(d.get("arg"))) in bmap]
    if not pairs:
        return []
    ds, bs = [p[0] for p in pairs], [p[1] for p in pairs]
    d = {s: _arr(ds, s) for s in (*STATS, "nan", "inf")}
    b = {s: _arr(bs, s) for s in (*STATS, "nan", "inf")}
    n = np.array([_numel(t.get("shape")) for t in ds], dtype="float64")
    m = stat_metrics(d, b, n)
    rows = []
    for i, (dt, bt) in enumerate(pairs):
        row: dict[str, Any] = {"tensor": f"{dt.get('io')}.{dt.get('arg')}", "io": dt.get("io"), "match": "manual",
                               "verdict": "none", "device_dtype": dt.get("dtype"), "bench_dtype": bt.get("dtype"),
                               "device_shape": dt.get("shape"), "bench_shape": bt.get("shape")}
        for s in STATS:
            for k in (f"{s}_diff", f"{s}_rel_diff"):
                if k in m:
                    v = float(m[k][i])
                    if not math.isnan(v):
                        row[k] = v
        err = float(m["stat_error"][i])
        if not math.isnan(err):
            row["error"] = err
        for s in ("nan", "inf"):
            v = dt.get(s)
            if isinstance(v, (int, float)) and v:
                row[f"device_{s}"] = v
        rows.append(jsonable({k: v for k, v in row.items() if v is not None}))
    return rows
