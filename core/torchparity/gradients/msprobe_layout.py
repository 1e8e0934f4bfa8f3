"""msprobe's gradient-probe files (seed 004), written from :class:`GradMonitor`'s step data and
read back to compare two runs' gradient directions.

Layout (``DIR`` = the config's ``dump_path``)::

    DIR/rank{R}/grad_summary_{S}.csv     one row per parameter; columns by level:
        L0: param_name, MD5, max, min, norm, shape
        L1: param_name, max, min, norm, shape
        L2: param_name, (-inf, b0], (b0, b1], ..., (bn, inf), =0, max, min, norm, shape
    DIR/rank{R}/step{S}/{param_name}.npy  the gradient's direction (bool: element > 0), L1 and L2

The interval columns and ``=0`` are fractions of the gradient's elements. ``.npy`` files hold
plain bool arrays and are read with ``allow_pickle=False``.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any

from ..errors import DumpError, UsageError
from .plots import plot_table, safe_file_name
from .sketch import STATS, interval_names

_I = {name: i for i, name in enumerate(STATS)}
_RANK_RE = re.compile(r"^rank(\d+)$")
_STEP_RE = re.compile(r"^step(\d+)$")


def header(level: str, bounds: list[float]) -> list[str]:
    """The ``grad_summary_{S}.csv`` header of ``level``."""
    if level == "L0":
        return ["param_name", "MD5", "max", "min", "norm", "shape"]
    if level == "L1":
        return ["param_name", "max", "min", "norm", "shape"]
    return ["param_name", *interval_names(bounds), "=0", "max", "min", "norm", "shape"]


def _cell_text(s: str) -> str:
    """A name as text in a spreadsheet: a leading ``= + - @`` would make it a formula."""
    return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s


def write_step(root: Path, rank: int, step: int, level: str, bounds: list[float], names: list[str],
               shapes: list[list[int]], stats: Any, dist: Any = None, md5: list[str] | None = None,
               signs: dict[str, Any] | None = None) -> list[Path]:
    """Write one step's csv (and ``.npy`` direction files); ``stats``/``dist`` are numpy arrays."""
    import numpy as np

    rank_dir = Path(root) / f"rank{int(rank)}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, name in enumerate(names):
        st = stats[i]
        tail = [repr(float(st[_I["max"]])), repr(float(st[_I["min"]])), repr(float(st[_I["norm"]])), str(list(shapes[i]))]
        if level == "L0":
            row = [_cell_text(name), (md5 or [""] * len(names))[i], *tail]
        elif level == "L1":
            row = [_cell_text(name), *tail]
        else:
            row = [_cell_text(name), *(repr(float(x)) for x in dist[i]), repr(float(st[_I["zero_frac"]])), *tail]
        rows.append(row)
    path = rank_dir / f"grad_summary_{int(step)}.csv"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header(level, bounds))
        w.writerows(rows)
    tmp.replace(path)
    written = [path]
    if signs:
        step_dir = rank_dir / f"step{int(step)}"
        step_dir.mkdir(exist_ok=True)
        for name, arr in signs.items():
            p = step_dir / (safe_file_name(name) + ".npy")
            np.save(p, np.asarray(arr, dtype=bool), allow_pickle=False)
            written.append(p)
    return written


def _directions(root: Path) -> dict[int, dict[int, dict[str, Path]]]:
    """``{rank: {step: {file stem: path}}}`` of a grad-probe dump's ``.npy`` files."""
    out: dict[int, dict[int, dict[str, Path]]] = {}
    for rd in root.iterdir():
        m = _RANK_RE.match(rd.name)
        if not m or not rd.is_dir():
            continue
        for sd in rd.iterdir():
            ms = _STEP_RE.match(sd.name)
            if ms and sd.is_dir():
                files = {f.stem: f for f in sd.glob("*.npy") if f.is_file()}
                if files:
                    out.setdefault(int(m.group(1)), {})[int(ms.group(1))] = files
    return out


def _load_bool(path: Path) -> Any:
    import numpy as np

    try:
        a = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise DumpError(f"{path}: unreadable direction file ({type(exc).__name__}: {exc}); delete it or dump again") from None
    if a.dtype != bool:
        raise DumpError(f"{path}: direction file holds {a.dtype}, not bool; not written by the gradient probe")
    return a.reshape(-1)


def similarities(path_a: Path, path_b: Path, rank: int, warnings: list[str]) -> Any:
    """Per parameter and step: the fraction of elements whose direction (sign) agrees; the row
    ``summary`` is the numel-weighted mean. A DataFrame (index = parameter, columns = steps);
    a parameter present on one side only, or of a different size, is NaN and named in ``warnings``."""
    import numpy as np
    import pandas as pd

    da, db = _directions(path_a).get(rank, {}), _directions(path_b).get(rank, {})
    steps = sorted(set(da) & set(db))
    if not steps:
        raise UsageError(f"rank {rank}: no step with direction data in both {path_a} and {path_b} "
                         "(dump both with grad_level L1 or L2, the same steps and ranks)")
    sims: dict[str, dict[int, float]] = {}
    weighted: dict[int, tuple[float, int]] = {}
    for s in steps:
        fa, fb = da[s], db[s]
        for name in sorted(set(fa) ^ set(fb)):
            warnings.append(f"rank {rank} step {s}: {name} has direction data on one side only; not compared")
            sims.setdefault(name, {})[s] = math.nan
        tot, n_tot = 0.0, 0
        for name in sorted(set(fa) & set(fb)):
            a, b = _load_bool(fa[name]), _load_bool(fb[name])
            if a.shape != b.shape:
                warnings.append(f"rank {rank} step {s}: {name} has {a.size} elements in {path_a} and {b.size} in {path_b}; not compared")
                sims.setdefault(name, {})[s] = math.nan
                continue
            sim = float((a == b).mean()) if a.size else 1.0
            sims.setdefault(name, {})[s] = sim
            tot, n_tot = tot + sim * a.size, n_tot + a.size
        weighted[s] = (tot, n_tot)
    table = pd.DataFrame.from_dict(sims, orient="index").reindex(columns=steps)
    table.loc["summary"] = [w[0] / w[1] if w[1] else np.nan for w in (weighted[s] for s in steps)]
    return table


def compare_dirs(path_a: str | Path, path_b: str | Path, output: str | Path, plots: bool = True) -> dict[str, Any]:
    """msprobe's ``GradComparator.compare_distributed``: ``similarities.csv`` (and per-parameter
    plots under ``similarities_picture/``) per rank; without a ``rank{R}`` level when both dumps
    hold a single rank. Returns ``{"tables": {rank: DataFrame}, "files": [...], "warnings": [...]}``."""
    a, b, out = Path(path_a), Path(path_b), Path(output)
    for p in (a, b):
        if not p.is_dir():
            raise UsageError(f"GradComparator: {p} is not a directory; pass the dump_path of a grad_probe run")
    if out.exists() and not out.is_dir():
        raise UsageError(f"GradComparator: output {out} exists and is not a directory")
    ra, rb = set(_directions(a)), set(_directions(b))
    ranks = sorted(ra & rb)
    if not ranks:
        raise UsageError(f"GradComparator: no rank with direction data (.npy) in both {a} (ranks {sorted(ra) or 'none'}) "
                         f"and {b} (ranks {sorted(rb) or 'none'}); dump both with grad_level L1 or L2")
    single = len(ra) == 1 and len(rb) == 1
    warnings: list[str] = []
    if ra ^ rb:
        warnings.append(f"ranks on one side only, not compared: {sorted(ra ^ rb)}")
    tables, files = {}, []
    for r in ranks:
        table = similarities(a, b, r, warnings)
        tables[r] = table
        rdir = out if single else out / f"rank{r}"
        rdir.mkdir(parents=True, exist_ok=True)
        csv_path = rdir / "similarities.csv"
        with open(csv_path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["step", *[str(s) for s in table.columns]])
            for name, row in table.iterrows():
                w.writerow([_cell_text(str(name)), *("nan" if v != v else repr(float(v)) for v in row)])
        files.append(csv_path)
        if plots:
            files += plot_table(table, rdir / "similarities_picture", ylabel="similarity",
                                summary_name="summary_similarities.png")
    return {"tables": tables, "files": files, "warnings": warnings}
