"""Per-parameter line plots of a gradient comparison (PNG, matplotlib imported lazily).

Used by ``torchparity grads A B --plots DIR`` (the sketch cosine per step) and by the msprobe
façade's ``GradComparator.compare_distributed`` (the direction similarity per step). No global
matplotlib state is touched (no ``pyplot``): the figures are drawn on an Agg canvas.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_name(name: str, limit: int = 150) -> str:
    """``name`` usable as one file name: no separators, no NUL, no leading dot (``../x`` -> ``x``)."""
    s = _UNSAFE.sub("_", name).strip("._") or "unnamed"
    return s[:limit]


def _figure_class() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plots need matplotlib, which is not installed: pip install matplotlib "
                         "(or leave out the plots)") from None
    return Figure, FigureCanvasAgg


def plot_series(path: Path, steps: Sequence[int], values: Sequence[float], *, title: str, ylabel: str,
                threshold: float | None = None) -> Path:
    """One line plot ``values`` over ``steps`` written to ``path`` (PNG)."""
    Figure, Canvas = _figure_class()
    fig = Figure(figsize=(6, 3.2), dpi=100)
    Canvas(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(list(steps), list(values), marker="o", linewidth=1.2)
    if threshold is not None:
        ax.axhline(threshold, color="tab:red", linestyle="--", linewidth=0.8)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(str(path), format="png")
    except OSError as exc:
        raise UsageError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return path


def plot_table(table: Any, out_dir: Path, *, ylabel: str, summary_name: str, threshold: float | None = None,
               plot_file: Any = None) -> list[Path]:
    """One PNG per row of ``table`` (a DataFrame: index = parameter names, columns = steps; the
    row named ``summary`` -> ``summary_name``). File names are sanitized parameter names."""
    _figure_class()  # fail before writing anything when matplotlib is missing
    written = []
    steps = [int(c) for c in table.columns]
    for name, row in table.iterrows():
        fname = summary_name if name == "summary" else (plot_file(name) if plot_file else safe_file_name(str(name)) + ".png")
        written.append(plot_series(Path(out_dir) / fname, steps, row.to_numpy(dtype=float), title=str(name),
                                   ylabel=ylabel, threshold=threshold))
    return written


def write_compare_plots(result: Any, out_dir: str | Path) -> list[Path]:
    """Plots of a :class:`~torchparity.gradients.compare.GradCompareResult`: the sketch cosine of
    every parameter over the steps, and ``summary.png`` (the numel-weighted mean cosine per
    step). With several ranks, one ``rank{R}/`` folder per rank."""
    import numpy as np
    import pandas as pd

    rows = result.rows
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--plots {out}: exists and is not a directory; pass a directory")
    ranks = sorted(set(int(r) for r in rows["rank"]))
    written: list[Path] = []
    for r in ranks:
        sub = rows[rows["rank"] == r]
        table = sub.pivot_table(index="param", columns="step", values="cosine", aggfunc="first", sort=False)
        w = sub.assign(wc=sub["cosine"] * sub["numel"])
        g = w.groupby("step")
        summary = (g["wc"].sum() / g["numel"].sum().replace(0, np.nan)).reindex(table.columns)
        table = pd.concat([table, summary.to_frame("summary").T])
        written += plot_table(table, out / f"rank{r}" if len(ranks) > 1 else out, ylabel="cosine",
                              summary_name="summary.png")
    return written
