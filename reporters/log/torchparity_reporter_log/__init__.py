"""torchparity console reporter: a readable summary of a comparison, with rich tables.

``write()`` prints a summary panel (rows per verdict, first divergence, root cause and why), the top
suspects and the first error rows, and returns no files. When the output is not a terminal (a CI
log, a pipe) it prints the same tables as plain text: no colour codes, no progress animation.

:func:`progress` is a helper for the compare engine (and anything else long-running): it wraps an
iterable with a rich progress bar on a terminal and returns the iterable untouched otherwise, so
non-interactive logs are never flooded::

    from torchparity_reporter_log import progress
    for pair in progress(pairs, total=len(pairs), description="comparing"):
        ...

rich is imported inside functions so plugin discovery stays fast.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable, Iterator, Mapping, TypeVar

from torchparity import hookimpl
from torchparity.results import complete_first_divergence
from torchparity.errors import PluginError
from torchparity.plugin_types import Reporter, count_verdict, format_number

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from rich.console import Console

    from torchparity.results import CompareResult

__version__ = "0.1.0"

T = TypeVar("T")

#: set to 1 to turn progress bars off even on a terminal
NO_PROGRESS_ENV = "TORCHPARITY_NO_PROGRESS"
VERDICT_STYLES = {"error": "bold red", "warning": "yellow", "pass": "green", "unmatched": "bright_black", "skip": "bright_black"}


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def progress(iterable: Iterable[T], total: int | None = None, description: str = "comparing", *,
             stream: IO[str] | None = None, min_total: int = 0) -> Iterable[T]:
    """``iterable`` with a progress bar when ``stream`` (default stderr) is a terminal.

    Not a terminal, ``TORCHPARITY_NO_PROGRESS=1``, or fewer than ``min_total`` items: the iterable
    is returned as is (no output at all). The bar is transient: it disappears when done.
    """
    stream = stream if stream is not None else sys.stderr
    if total is None and hasattr(iterable, "__len__"):
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if os.environ.get(NO_PROGRESS_ENV, "") not in ("", "0") or not _is_tty(stream):
        return iterable
    if total is not None and total < min_total:
        return iterable
    return _progress_iter(iterable, total, description, stream)


def _progress_iter(iterable: Iterable[T], total: int | None, description: str, stream: IO[str]) -> Iterator[T]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


# ------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------


def fmt(x: Any, spec: str = ".3g") -> str:
    """A number for the console: 3 significant digits, NaN/inf spelled out, missing as '-'."""
    return format_number(x, spec, missing="-")


def _val(row: Mapping[str, Any], key: str) -> Any:
    v = row.get(key)
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _count(summary: Mapping[str, Any], rows: pd.DataFrame | None, key: str, verdict: str) -> int:
    """A verdict count from the summary (``n_unmatched`` may be split into device/bench) or the rows;
    a summary count that is not a whole number is passed over, not taken as 0."""
    return count_verdict(summary, rows, key, verdict, fall_back_on_bad=True)


first_divergence = complete_first_divergence  # shared with the other reporters (torchparity.results)


class LogReporter(Reporter):
    """Console summary: verdict counts, first divergence, root cause, suspects, first errors."""

    name = "log"
    description = "console summary (rich tables); plain text when not a terminal"

    @dataclass
    class Options:
        #: suspects shown
        top_suspects: int = 5
        #: error rows shown
        max_error_rows: int = 10
        #: auto (colour on a terminal only) | always | never
        color: str = "auto"
        #: stdout | stderr
        stream: str = "stdout"
        #: console width in characters (0: the terminal's, 120 when not a terminal)
        width: int = 0

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if o.color not in ("auto", "always", "never"):
            raise PluginError(f"reporter 'log': option color={o.color!r} is not one of auto, always, never")
        if o.stream not in ("stdout", "stderr"):
            raise PluginError(f"reporter 'log': option stream={o.stream!r} is not one of stdout, stderr")
        if int(o.top_suspects) < 0 or int(o.max_error_rows) < 0 or int(o.width) < 0:
            raise PluginError("reporter 'log': top_suspects, max_error_rows and width must be >= 0")

    def console(self, file: IO[str] | None = None) -> Console:
        """The rich console this reporter prints to."""
        from rich.console import Console

        o = self.options
        stream = file if file is not None else (sys.stderr if o.stream == "stderr" else sys.stdout)
        tty = _is_tty(stream)
        kwargs: dict[str, Any] = dict(file=stream, highlight=False, soft_wrap=False)
        if o.color == "always":
            kwargs["force_terminal"] = True
        elif o.color == "never" or not tty:
            kwargs.update(no_color=True, color_system=None, force_terminal=False)
        if o.width:
            kwargs["width"] = int(o.width)
        elif not tty:
            kwargs["width"] = 120
        return Console(**kwargs)

    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Print the summary to the console; no files are written."""
        self.render(result, self.console(), output_dir)
        return []

    # -- rendering -------------------------------------------------------------------------------
    def render(self, result: CompareResult, console: Console, output_dir: Path | None = None) -> None:
        """Print the panels and tables for ``result`` on ``console``."""
        from rich import box
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        rows = result.rows
        summary: Mapping[str, Any] = dict(result.summary or {})
        rc = result.root_cause
        n = {v: _count(summary, rows, f"n_{v}", v) for v in ("error", "warning", "pass", "unmatched", "skip")}
        n_rows = int(summary.get("n_rows") or (len(rows) if rows is not None else 0))

        if rc is not None:
            headline, style = "DIVERGED", "bold red"
        elif n["error"]:
            headline, style = f"{n['error']} ERROR ROW{'S' if n['error'] != 1 else ''} (no root cause named)", "bold red"
        elif n["warning"]:
            headline, style = f"{n['warning']} warnings, no errors", "yellow"
        elif n_rows == 0 or n["pass"] == 0:
            headline, style = "NOTHING COMPARED", "bold yellow"
        elif not summary.get("complete", True):  # not compared / damaged parts: never "no divergence"
            headline, style = "INCOMPLETE: no divergence among what was compared", "bold yellow"
        else:
            headline, style = "no divergence", "bold green"

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        counts = Text()
        for v in ("error", "warning", "pass", "unmatched", "skip"):
            if v == "skip" and not n[v]:
                continue
            counts.append(f"{n[v]} {v}", style=VERDICT_STYLES[v] if n[v] else "")
            counts.append("   ")
        counts.append(f"({n_rows} rows" + (f", {summary['mode']} mode)" if summary.get("mode") else ")"))
        grid.add_row("verdicts", counts)
        if summary.get("device_dump") or summary.get("bench_dump"):
            grid.add_row("compared", f"{summary.get('device_dump', '?')}  vs  {summary.get('bench_dump', '?')}")
        fd = first_divergence(summary, rows, rc)
        if fd:
            bits = [str(fd.get("name") or fd.get("op") or "?")]
            if fd.get("op") and fd.get("op") != fd.get("name"):
                bits.append(f"({fd['op']})")
            if fd.get("module"):
                bits.append(f"module '{fd['module']}'")
            where = ", ".join(f"{k} {fd[k]}" for k in ("step", "rank") if fd.get(k) is not None)
            grid.add_row("first divergence", " ".join(bits) + (f", {where}" if where else ""))
        if rc is not None:
            grid.add_row("root cause", Text(f"{rc.name} ({rc.op}) module '{rc.module or '<top level>'}', "
                                            f"step {rc.step}, rank {rc.rank}, {rc.phase}", style="bold red"))
            grid.add_row("why", f"input error {fmt(rc.input_error)} -> output error {fmt(rc.output_error)} "
                                f"(amplified x{fmt(rc.score)})")
            if rc.reason:
                grid.add_row("analysis", rc.reason)
        elif n["error"]:
            grid.add_row("root cause", Text("none named; see the error rows below", style="red"))
        if n["unmatched"]:
            grid.add_row("not compared", f"{n['unmatched']} unmatched rows (on one side only)")
        if output_dir is not None:
            grid.add_row("reports", str(output_dir))
        console.print(Panel(grid, title=Text(f"torchparity compare: {headline}", style=style), box=box.ROUNDED,
                            expand=False))

        suspects = list(result.suspects or [])[: int(self.options.top_suspects)]
        if suspects:
            t = Table(title="Top suspects", box=box.SIMPLE_HEAD, title_justify="left")
            for col, kw in (("#", {"justify": "right"}), ("record", {"overflow": "fold", "ratio": 3}),
                            ("module", {"overflow": "fold", "ratio": 2}), ("step/rank", {"no_wrap": True}),
                            ("phase", {"no_wrap": True}), ("input err", {"justify": "right", "no_wrap": True}),
                            ("output err", {"justify": "right", "no_wrap": True}),
                            ("amplif.", {"justify": "right", "no_wrap": True})):
                t.add_column(col, **kw)
            for i, s in enumerate(suspects, 1):
                is_root = rc is not None and s.name == rc.name and s.step == rc.step and s.rank == rc.rank
                t.add_row(str(i), f"{s.name} ({s.op})", s.module, f"{s.step}/{s.rank}", s.phase, fmt(s.input_error),
                          fmt(s.output_error), "x" + fmt(s.score), style="bold red" if is_root else None)
            console.print(t)

        limit = int(self.options.max_error_rows)
        if limit and rows is not None and len(rows) and "verdict" in rows.columns and (n["error"] or n["warning"]):
            which = "error" if n["error"] else "warning"
            bad = rows[rows["verdict"].astype(object).eq(which)]
            if {"step", "rank", "order"} <= set(rows.columns):
                bad = bad.sort_values(["step", "rank", "order"], kind="stable")
            title = f"First {min(limit, len(bad))} of {len(bad)} {which} rows"
            t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
            metric_cols = [c for c in ("rel_l2", "cosine", "max_abs_err", "norm_rel_diff") if c in rows.columns
                           and rows[c].notna().any()][:2]
            shown = bad.head(limit).to_dict("records")
            names = []
            for r in shown:
                name = f"{_val(r, 'device_name') or _val(r, 'bench_name') or '?'}"
                if _val(r, "tensor"):
                    name += f".{r['tensor']}"
                names.append(name)
            # record names are what people search for: keep them on one line where they fit
            name_width = min(max((len(x) for x in names), default=6), max(24, console.width - 80))
            for col in ["tensor", "module", "step/rank", *metric_cols, "reason"]:
                kw: dict[str, Any] = {"justify": "right" if col in metric_cols else "left", "overflow": "fold",
                                      "no_wrap": col in metric_cols or col == "step/rank"}
                if col == "tensor":
                    kw["min_width"] = name_width
                elif col == "module":
                    kw["ratio"] = 1
                elif col == "reason":
                    kw.update(ratio=2, min_width=24)
                t.add_column(col, **kw)
            for name, r in zip(names, shown):
                t.add_row(name, str(_val(r, "module") or ""),
                          f"{_val(r, 'step') if _val(r, 'step') is not None else '-'}/{_val(r, 'rank') if _val(r, 'rank') is not None else '-'}",
                          *[fmt(_val(r, c), ".6f" if c == "cosine" else ".3g") for c in metric_cols],
                          str(_val(r, "reason") or ""), style=VERDICT_STYLES[which])
            console.print(t)


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield LogReporter()
