"""The xlsx reporter: msprobe columns, verdict colours, frozen header, filter, Summary sheet."""

from __future__ import annotations

from pathlib import Path

import openpyxl
import pandas as pd
import pytest

from torchparity.errors import PluginError
from torchparity.plugins import get_registry
from torchparity.results import CompareResult
from torchparity_reporter_xlsx import RESULT_FILLS, ROW_FILLS, XlsxReporter

#: msprobe's tensor-mode columns (verbatim) that our data covers, in msprobe's relative order
MSPROBE_TENSOR = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                  "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio", "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max",
                  "Bench min", "Bench mean", "Bench l2norm", "Result", "Err_message", "NPU_Stack_Info"]
MSPROBE_STATS = ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                 "MeanRelativeErr", "NormRelativeErr"]


def _write(result: CompareResult, tmp_path: Path, **options) -> Path:
    rep = XlsxReporter()
    rep.configure(options)
    (path,) = rep.write(result, tmp_path / "out")
    assert path.name == "compare.xlsx" and path.is_file()
    assert not list(path.parent.glob("~$*")), "temporary file left behind"
    return path


def _sheet(path: Path):
    wb = openpyxl.load_workbook(path)
    ws = wb["Compare"]
    headers = [c.value for c in ws[1]]
    return wb, ws, headers


def _rgb(cell) -> str:
    return (cell.fill.fgColor.rgb or "")[-6:] if cell.fill and cell.fill.fill_type == "solid" else ""


def _summary_text(wb) -> str:
    return "\n".join(" | ".join(str(v) for v in row if v is not None)
                     for row in wb["Summary"].iter_rows(values_only=True))


def test_registered_as_plugin():
    assert "xlsx" in get_registry().reporters


def test_divergent_result(compare_result, tmp_path):
    wb, ws, headers = _sheet(_write(compare_result, tmp_path))
    assert wb.sheetnames == ["Summary", "Compare"]
    pos = [headers.index(h) for h in MSPROBE_TENSOR]
    assert pos == sorted(pos), "msprobe columns out of msprobe's order"
    for h in ("Op", "Module", "Phase", "Step", "Rank", "Match"):
        assert h in headers
    assert ws.freeze_panes == "B2"
    assert ws.auto_filter.ref == f"A1:{openpyxl.utils.get_column_letter(len(headers))}{len(compare_result.rows) + 1}"
    assert ws.max_row == len(compare_result.rows) + 1
    assert _rgb(ws["A1"]) and ws["A1"].font.b  # styled header

    res_col, msg_col = headers.index("Result"), headers.index("Err_message")
    seen = {}
    for row in ws.iter_rows(min_row=2):
        seen.setdefault(row[res_col].value, row)
    # the root cause's rows are flagged and highlighted
    rc = compare_result.root_cause
    root_rows = [r for r in ws.iter_rows(min_row=2) if r[0].value.startswith(rc.name + ".")]
    assert root_rows and all(_rgb(r[1]) == ROW_FILLS["root"] for r in root_rows)
    assert any(str(r[msg_col].value).startswith("ROOT CAUSE") for r in root_rows)
    # colours by verdict (Result cell) and a tint on the rest of a bad row
    assert _rgb(seen["pass"][res_col]) == RESULT_FILLS["pass"]
    err = next(r for r in ws.iter_rows(min_row=2) if r[res_col].value == "error" and r not in root_rows)
    assert _rgb(err[res_col]) == RESULT_FILLS["error"] and _rgb(err[0]) == ROW_FILLS["error"]
    um = seen["unmatched"]
    assert _rgb(um[res_col]) == RESULT_FILLS["unmatched"]
    assert um[headers.index("Bench Name")].value is None
    assert um[msg_col].value  # the fixture's own reason ("no benchmark record") is kept
    assert "\n" in ws.cell(row=2, column=headers.index("NPU_Stack_Info") + 1).value

    text = _summary_text(wb)
    assert "DIVERGED" in text and rc.name in text and "layers.1.mlp.fc1" in text
    assert "unmatched | 2" in text and "error | 11" in text
    # first divergence completed with op and module from the rows
    assert "module | layers.1.mlp.fc1" in text and "op | aten.mm.default" in text
    # the root cause links to its first row
    link = next(c.value for row in wb["Summary"].iter_rows() for c in row
                if isinstance(c.value, str) and c.value.startswith("=HYPERLINK"))
    first = next(i for i, r in enumerate(ws.iter_rows(min_row=2), 2) if r in root_rows or r[0].value.startswith(rc.name + "."))
    assert f"'Compare'!A{first}" in link


def test_warning_colour(make_result, tmp_path):
    res = make_result("matmul")
    res.rows.loc[res.rows["verdict"] == "error", "verdict"] = "warning"
    res.root_cause = None
    res.suspects = []
    wb, ws, headers = _sheet(_write(res, tmp_path))
    res_col = headers.index("Result")
    warn = next(r for r in ws.iter_rows(min_row=2) if r[res_col].value == "warning")
    assert _rgb(warn[res_col]) == RESULT_FILLS["warning"] and _rgb(warn[0]) == ROW_FILLS["warning"]


def test_agreeing_result(agreeing, tmp_path):
    wb, ws, headers = _sheet(_write(agreeing, tmp_path))
    text = _summary_text(wb)
    assert "no divergence" in text and "DIVERGED" not in text and "ROOT CAUSE" not in text
    assert {r[headers.index("Result")] for r in ws.iter_rows(min_row=2, values_only=True)} == {"pass"}


def test_errors_without_root_cause_are_not_ok(make_result, tmp_path):
    wb, _, _ = _sheet(_write(make_result("matmul", errors_without_root=True), tmp_path))
    text = _summary_text(wb)
    assert "NOT OK" in text and "no divergence" not in text


def test_special_values(compare_result, tmp_path):
    _, ws, headers = _sheet(_write(compare_result, tmp_path))
    assert ws.cell(row=3 + 2, column=headers.index("MaxRelativeErr") + 1).value == "inf"
    assert ws.cell(row=5 + 2, column=headers.index("NPU max") + 1).value == "NaN"
    assert ws.cell(row=5 + 2, column=headers.index("NPU NaN") + 1).value == 1
    assert ws.cell(row=2, column=headers.index("NPU Tensor Shape") + 1).value == "[4, 64]"


def test_statistics_mode_columns(compare_result, tmp_path):
    tensor_metrics = ["cosine", "max_abs_err", "max_rel_err", "mean_rel_err", "rmse", "euc_dist",
                      "one_thousandth_ratio", "five_thousandth_ratio", "worst_index", "rel_l2"]
    rows = compare_result.rows.drop(columns=tensor_metrics)
    res = CompareResult(rows=rows, summary=dict(compare_result.summary, mode="statistics"),
                        root_cause=compare_result.root_cause, suspects=compare_result.suspects)
    path = _write(res, tmp_path)
    _, ws, headers = _sheet(path)
    assert "Cosine" not in headers and "MaxAbsErr" not in headers
    pos = [headers.index(h) for h in MSPROBE_STATS]
    assert pos == sorted(pos)
    # relative errors are shown as percentages, as msprobe does
    cell = ws.cell(row=2, column=headers.index("NormRelativeErr") + 1)
    assert cell.number_format == "0.000%"
    df = pd.read_excel(path, sheet_name="Compare")
    assert len(df) == len(rows) and list(df.columns) == headers


def test_md5_mode_and_requires_grad(compare_result, tmp_path):
    rows = compare_result.rows.copy()
    rows["device_md5"] = "abc"
    rows["bench_md5"] = ["abc"] * (len(rows) - 1) + ["abd"]
    rows["device_requires_grad"] = True
    rows["bench_requires_grad"] = [True] * (len(rows) - 1) + [False]
    res = CompareResult(rows=rows, summary=compare_result.summary, root_cause=compare_result.root_cause)
    _, ws, headers = _sheet(_write(res, tmp_path))
    for h in ("NPU MD5", "BENCH MD5", "NPU Requires_grad", "Bench Requires_grad", "Requires_grad Consistent"):
        assert h in headers
    last = [c.value for c in ws[ws.max_row]]
    assert last[headers.index("BENCH MD5")] == "abd"
    assert last[headers.index("Requires_grad Consistent")] is False
    assert ws.cell(row=2, column=headers.index("Requires_grad Consistent") + 1).value is True


def test_only_problems_and_no_stack(compare_result, tmp_path):
    _, ws, headers = _sheet(_write(compare_result, tmp_path, include_pass=False, include_stack=False))
    assert "NPU_Stack_Info" not in headers
    rc = compare_result.root_cause.name
    rows = list(ws.iter_rows(min_row=2, values_only=True))
    results = {r[headers.index("Result")] for r in rows}
    assert {"error", "unmatched"} <= results
    # passing rows are left out, except the root cause's own inputs (shown for context)
    assert all(r[0].startswith(rc + ".") for r in rows if r[headers.index("Result")] == "pass")
    assert len(rows) < len(compare_result.rows)


def test_split_over_sheets(compare_result, tmp_path):
    wb, ws, _ = _sheet(_write(compare_result, tmp_path, max_rows_per_sheet=40))
    assert wb.sheetnames == ["Summary", "Compare", "Compare (2)", "Compare (3)"]
    n = sum(wb[s].max_row - 1 for s in wb.sheetnames[1:])
    assert n == len(compare_result.rows)
    assert wb["Compare (3)"].freeze_panes == "B2"


def test_empty_result(empty, tmp_path):
    wb, ws, headers = _sheet(_write(empty, tmp_path))
    assert ws.max_row == 1 and "Result" in headers
    assert "NPU Name" in headers


def test_bad_options(tmp_path):
    with pytest.raises(PluginError, match="ending in .xlsx"):
        XlsxReporter().configure({"filename": "a.csv"})
    with pytest.raises(PluginError, match="unknown option"):
        XlsxReporter().configure({"colour": "red"})


def test_text_is_sanitised(compare_result, tmp_path):
    rows = compare_result.rows.copy()
    rows.loc[0, "reason"] = "bad \x00\x07 chars <&> \"quoted\""
    rows.loc[1, "reason"] = "=HYPERLINK(\"http://x\")"
    res = CompareResult(rows=rows, summary=compare_result.summary)
    _, ws, headers = _sheet(_write(res, tmp_path))
    col = headers.index("Err_message") + 1
    assert ws.cell(row=2, column=col).value == "bad  chars <&> \"quoted\""
    assert ws.cell(row=3, column=col).data_type == "s"  # text, never a formula


def test_real_compare(real_compare, tmp_path):
    wb, ws, headers = _sheet(_write(real_compare, tmp_path))
    rc = real_compare.root_cause
    assert rc.name in _summary_text(wb)
    res_col = headers.index("Result")
    rows = list(ws.iter_rows(min_row=2))
    assert len(rows) == len(real_compare.rows)
    root = [r for r in rows if r[0].value.startswith(rc.name + ".output")]
    assert root and root[0][res_col].value == "error" and _rgb(root[0][0]) == ROW_FILLS["root"]
    # the engine leaves unmatched rows without a reason: the report says which side has them
    msg = headers.index("Err_message")
    um = [r for r in rows if r[res_col].value == "unmatched"]
    assert um and all(r[msg].value == "only in the device dump: no benchmark record" for r in um)


def test_100k_rows(big, tmp_path):
    path = _write(big, tmp_path)
    wb = openpyxl.load_workbook(path, read_only=True)
    assert wb.sheetnames == ["Summary", "Compare"]
    ws = wb["Compare"]
    assert ws.max_row == 100_001
    header = next(ws.iter_rows(max_row=1, values_only=True))
    assert header[0] == "NPU Name"
    wb.close()
