"""Untrusted names (ops, modules, files come from the user's model and dumps) in the reports:
formula-like text stays text in the workbook, illegal characters never break a report."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import openpyxl
import pytest

from torchparity.results import CompareResult
from torchparity_reporter_xlsx import XlsxReporter
from torchparity_reporter_xlsx._text import hyperlink_formula, is_formula_like

#: first characters that make a spreadsheet evaluate a cell (OWASP "CSV injection" list + full-width)
EVIL = ["=HYPERLINK(\"http://evil\",\"x\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)*cmd|' /C calc'!A0",
        "\t=1+1", "\r=1+1", "＝1+1", "<script>alert(1)</script>", "../../etc/passwd"]


def _evil_result(compare_result: CompareResult) -> tuple[CompareResult, dict[str, str]]:
    """The matmul result with the root cause and other rows renamed to formula-like names."""
    rows = compare_result.rows.copy()
    rc = compare_result.root_cause
    root_name = "=cmd|' /C calc'!A0\x00\x07\"q\"" + "x" * 300  # + NUL, BEL, quotes, longer than a formula literal
    rows.loc[rows["device_name"] == rc.name, "device_name"] = root_name
    for i, evil in enumerate(EVIL):
        rows.loc[i, "device_name"] = evil
        rows.loc[i, "bench_name"] = evil
        rows.loc[i, "module"] = evil
        rows.loc[i, "op"] = evil
        rows.loc[i, "reason"] = evil
    new_rc = dataclasses.replace(rc, name=root_name, module="@evil.module", op="=aten.evil()", reason="-3+4")
    suspects = [new_rc] + [dataclasses.replace(s, name=EVIL[k % len(EVIL)], module="+m")
                           for k, s in enumerate(compare_result.suspects[1:])]
    summary = dict(compare_result.summary, device_dump="=evil_dump_dir", note="@note")
    summary["first_divergence"] = dict(summary["first_divergence"], name=root_name)
    return CompareResult(rows=rows, summary=summary, root_cause=new_rc, suspects=suspects), {"root": root_name}


def _write(result: CompareResult, out: Path) -> Path:
    rep = XlsxReporter()
    rep.configure({})
    (path,) = rep.write(result, out)
    return path


@pytest.mark.parametrize("text", EVIL[:7])
def test_formula_triggers_are_recognised(text):
    assert is_formula_like(text)
    assert not is_formula_like("Aten.mm.0.forward") and not is_formula_like("")


def test_hyperlink_label_is_a_safe_literal():
    f = hyperlink_formula("#'Compare'!A2", '=a"b' + "\x00" + "y" * 400)
    literal = f[len("=HYPERLINK(\"#'Compare'!A2\",\""):-2]
    assert '""' in literal and "\x00" not in literal
    assert len(literal.replace('""', '"')) <= 255
    assert literal.replace('""', "").count('"') == 0  # every quote of the label is doubled: no breakout


def test_formula_like_names_are_text_cells_in_the_workbook(compare_result, tmp_path):
    res, _ = _evil_result(compare_result)
    path = _write(res, tmp_path)
    wb = openpyxl.load_workbook(path)
    formulas = []
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for c in row:
                if c.data_type == "f":
                    formulas.append((ws.title, c.coordinate, c.value))
                elif isinstance(c.value, str) and is_formula_like(c.value) and c.value not in ("-inf",):
                    # formula-like text: a string cell that also keeps the quote prefix when edited
                    assert c.data_type == "s" and c.quotePrefix, (ws.title, c.coordinate, c.value)
    # the only formula is our own link to the root cause's rows
    assert len(formulas) == 1 and formulas[0][0] == "Summary" and formulas[0][2].startswith("=HYPERLINK(\"#'Compare'!A")
    compare = wb["Compare"]
    headers = [c.value for c in compare[1]]
    col = headers.index("Module") + 1
    got = [compare.cell(row=r, column=col).value for r in range(2, 2 + len(EVIL))]
    assert got == EVIL  # the value is unchanged: text, searchable, nothing prepended
    summary_values = [c.value for row in wb["Summary"].iter_rows() for c in row if isinstance(c.value, str)]
    assert "@evil.module" in summary_values and "=aten.evil()" in summary_values and "=evil_dump_dir" in summary_values
    assert not any("\x00" in v or "\x07" in v for v in summary_values)


def test_compare_sheet_xml_has_no_formula_elements(compare_result, tmp_path):
    res, _ = _evil_result(compare_result)
    path = _write(res, tmp_path)
    with zipfile.ZipFile(path) as z:
        compare_xml = z.read("xl/worksheets/sheet2.xml").decode()
    assert "<f>" not in compare_xml and "&lt;script&gt;" in compare_xml and "<script>" not in compare_xml


def test_json_and_advisor_keep_names_as_data(compare_result, tmp_path):
    from torchparity_reporter_advisor import AdvisorReporter
    from torchparity_reporter_json import JsonReporter

    res, names = _evil_result(compare_result)
    for cls in (JsonReporter, AdvisorReporter):
        rep = cls()
        rep.configure({})
        (p,) = rep.write(res, tmp_path)
        assert p.parent == tmp_path  # the file name is the reporter's, never a name from the data
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert any(r.get("module") == "<script>alert(1)</script>" for r in doc["rows"])  # JSON: exact, escaped by json
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advisor.txt", "compare.json"]
