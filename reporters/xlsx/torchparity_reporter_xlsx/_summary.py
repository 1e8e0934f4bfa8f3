"""The Summary sheet: verdict counts, first divergence, root cause (linked to its rows), the top
suspects and the rest of the result's summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from torchparity.plugin_types import count_verdict
from torchparity.results import complete_first_divergence

from ._cells import _num, _plain
from ._rows import _unmatched_mask
from ._styles import _Styles
from ._text import hyperlink_formula, is_formula_like

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import CompareResult


def _summary_sheet(ws: Any, result: CompareResult, st: _Styles, root_rows: list[int],
                   n_written: int, per_sheet: int, top_suspects: int) -> None:
    """Fill ``ws`` with the Summary sheet of ``result``, listing at most ``top_suspects`` suspects."""
    summary = dict(result.summary or {})
    rows = result.rows
    lines: list[list[tuple[Any, dict[str, Any]]]] = []

    def cell(value: Any, **style: Any) -> tuple[Any, dict[str, Any]]:
        return (value, style)

    def add(*values: tuple[Any, dict[str, Any]]) -> None:
        lines.append(list(values))

    try:
        diverged = bool(result.diverged)
    except Exception:
        diverged = result.root_cause is not None
    n_error = _count(summary, rows, "n_error", "error")
    add(cell("torchparity compare", font=st.title_font))
    if result.root_cause is not None:
        verdict_line = "DIVERGED"
    elif n_error:
        verdict_line = f"NOT OK: {n_error} error rows, no root cause identified"
    elif diverged:
        verdict_line = "DIVERGED"
    else:
        verdict_line = "no divergence"
    add(cell("Verdict", font=st.bold), cell(verdict_line, font=st.root_font if (diverged or n_error) else st.bold))
    for key, label in (("device_dump", "Device dump"), ("bench_dump", "Benchmark dump"), ("mode", "Mode"),
                       ("device_backend", "Device backend"), ("bench_backend", "Benchmark backend")):
        if summary.get(key) is not None:
            add(cell(label, font=st.bold), cell(summary[key]))
    add()
    add(cell("Verdict counts", font=st.section_font))
    add(cell("Verdict", font=st.header_font, fill=st.header_fill), cell("Rows", font=st.header_font, fill=st.header_fill))
    for verdict in ("error", "warning", "pass", "unmatched", "skip"):
        k = _count(summary, rows, f"n_{verdict}", verdict)
        if verdict == "skip" and not k:
            continue
        fill = st.result_fill.get(verdict)
        add(cell(verdict, fill=fill) if fill else cell(verdict), cell(k))
    n_total = _int(summary.get("n_rows"), len(rows) if rows is not None else 0)
    add(cell("total", font=st.bold), cell(n_total, font=st.bold))
    if n_written != n_total:
        add(cell(f"(the Compare sheet shows {n_written} of them)"))
    add()
    add(cell("First divergence", font=st.section_font))
    fd = first_divergence(summary, rows, result.root_cause)
    if not fd:
        add(cell("none"))
    else:
        for k in ("step", "rank", "name", "op", "module", "phase", "index"):
            if fd.get(k) is not None:
                add(cell(k, font=st.bold), cell(fd[k]))
        for k, v in fd.items():
            if k not in ("step", "rank", "name", "op", "module", "phase", "index"):
                add(cell(k, font=st.bold), cell(v))
    add()
    add(cell("Root cause", font=st.section_font))
    rc = result.root_cause
    if rc is None:
        add(cell("none identified" + (f" ({n_error} rows are errors: filter Result = error on the Compare sheet)" if n_error else "")))
    else:
        if root_rows:
            k, r = divmod(root_rows[0], per_sheet)
            sheet = "Compare" if k == 0 else f"Compare ({k + 1})"
            add(cell("name", font=st.bold),
                cell(hyperlink_formula(f"#'{sheet}'!A{r + 2}", str(rc.name)), font=st.link_font, formula=True))
        else:
            add(cell("name", font=st.bold), cell(rc.name))
        for label, value in (("op", rc.op), ("module", rc.module), ("phase", rc.phase), ("step", rc.step),
                             ("rank", rc.rank), ("kind", rc.kind),
                             ("amplification (output err / input err)", _num(rc.score)),
                             ("input error", _num(rc.input_error)), ("output error", _num(rc.output_error)),
                             ("reason", rc.reason)):
            add(cell(label, font=st.bold), cell(value))
    add()
    suspects = list(result.suspects or [])[: int(top_suspects)]
    add(cell("Suspects", font=st.section_font))
    if not suspects:
        add(cell("none"))
    else:
        hdr = ("#", "Name", "Op", "Module", "Phase", "Step", "Rank", "Amplification", "Input err", "Output err", "Reason")
        add(*[cell(h, font=st.header_font, fill=st.header_fill) for h in hdr])
        for i, s in enumerate(suspects, 1):
            add(cell(i), cell(s.name), cell(s.op), cell(s.module), cell(s.phase), cell(s.step), cell(s.rank),
                cell(_num(s.score)), cell(_num(s.input_error)), cell(_num(s.output_error)), cell(s.reason))
    shown = {"device_dump", "bench_dump", "mode", "device_backend", "bench_backend", "n_error", "n_warning",
             "n_pass", "n_unmatched", "n_skip", "n_rows", "first_divergence"}
    rest = {k: v for k, v in summary.items() if k not in shown}
    if rest:
        add()
        add(cell("Details", font=st.section_font))
        for k, v in rest.items():
            add(cell(str(k), font=st.bold), cell(v))

    widths = {"A": 38, "B": 34, "C": 22, "D": 26, "E": 11, "F": 7, "G": 7, "H": 14, "I": 11, "J": 11, "K": 60}
    for letter, w in widths.items():
        ws.column_dimensions[letter].width = w
    for r, line in enumerate(lines, 1):
        for c, (value, style) in enumerate(line, 1):
            formula = style.pop("formula", False)
            x = ws.cell(row=r, column=c, value=_plain(value))
            if isinstance(x.value, str) and not formula:
                x.data_type = "s"  # openpyxl makes every "=..." string a formula: names are text
                if is_formula_like(x.value):
                    x.quotePrefix = True
            for k, v in style.items():
                if v is not None:
                    setattr(x, k, v)


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _count(summary: Mapping[str, Any], rows: pd.DataFrame | None, key: str, verdict: str) -> int:
    """A verdict count from the summary (``n_unmatched`` may be split into device/bench) or the rows;
    unmatched rows are found as on the Compare sheet (:func:`._rows._unmatched_mask`)."""
    return count_verdict(summary, rows, key, verdict, unmatched_mask=_unmatched_mask)


first_divergence = complete_first_divergence  # shared with the other reporters (torchparity.results)
