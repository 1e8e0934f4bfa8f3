"""Output directories that cannot be used, and a disk that fills while reporters write."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from torchparity.errors import PluginError, UsageError
from torchparity.plugin_types import OutputDirError, prepare_output_dir, write_reports
from torchparity_reporter_advisor import AdvisorReporter
from torchparity_reporter_json import JsonReporter
from torchparity_reporter_xlsx import XlsxReporter


def _reporters() -> dict:
    reps = {"json": JsonReporter(), "xlsx": XlsxReporter(), "advisor": AdvisorReporter()}
    for r in reps.values():
        r.configure({})
    return reps


@pytest.mark.parametrize("case", ["proc", "file", "under_file", "nul", "too_long"])
def test_unusable_output_dir_is_one_line_usage_error(tmp_path, case):
    (tmp_path / "f").write_text("x")
    bad = {"proc": "/proc/x", "file": tmp_path / "f", "under_file": tmp_path / "f" / "sub",
           "nul": str(tmp_path / "a\x00b"), "too_long": tmp_path / ("n" * 300)}[case]
    with pytest.raises(UsageError) as e:
        prepare_output_dir(bad, "xlsx")
    msg = str(e.value)
    assert isinstance(e.value, PluginError)  # what reporters raised before: callers catching it still do
    assert "\n" not in msg and "\x00" not in msg and msg.startswith("reporter 'xlsx': output directory ")
    assert "choose another --output" in msg


def test_not_writable_output_dir(tmp_path, monkeypatch):
    # the tests may run as root, for whom chmod 0500 changes nothing: ask os.access to say no
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(OutputDirError, match="is not writable; choose another --output or fix its permissions"):
        prepare_output_dir(tmp_path, "json")


def test_write_reports_refuses_a_bad_output_dir_before_any_reporter(compare_result, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputDirError, match="output directory .* exists and is not a directory"):
        write_reports(compare_result, _reporters(), ["json", "xlsx"], tmp_path / "f")
    with pytest.raises(OutputDirError, match="cannot be created"):
        write_reports(compare_result, _reporters(), ["json"], "/proc/x")


@pytest.mark.parametrize("victim", ["json", "xlsx", "advisor"])
def test_disk_full_in_one_reporter_costs_only_its_report(compare_result, tmp_path, monkeypatch, victim):
    out = tmp_path / "out"
    reps = _reporters()
    old = write_reports(compare_result, reps, list(reps), out)[0]  # a previous run's reports
    before = {p.name: p.read_bytes() for ps in old.values() for p in ps}
    real_open = open

    def full_open(file, mode="r", *a, **kw):  # noqa: ANN001 - mimics builtins.open
        f = real_open(file, mode, *a, **kw)
        if "w" in mode and victim_file(file):
            f.write("partial" if "b" not in mode else b"partial")
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return f

    def victim_file(file) -> bool:
        name = Path(file).name
        return {"json": "compare.json", "xlsx": "compare.xlsx", "advisor": "advisor.txt"}[victim] in name

    import builtins
    import io

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)  # pathlib and zipfile open files with io.open
    written, warnings = write_reports(compare_result, reps, list(reps), out)
    monkeypatch.undo()
    assert set(written) == set(reps) - {victim}
    assert len(warnings) == 1 and "\n" not in warnings[0]
    w = warnings[0]
    assert f"reporter '{victim}'" in w and "No space left on device" in w and "free disk space" in w
    assert f"the {victim} report is missing, the other reports were written" in w
    # the previous report of the victim is intact and nothing half-written was left behind
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(files) == sorted(before)
    victim_name = {"json": "compare.json", "xlsx": "compare.xlsx", "advisor": "advisor.txt"}[victim]
    assert files[victim_name] == before[victim_name]


def test_a_reporter_bug_costs_only_its_report(compare_result, tmp_path):
    class Broken(JsonReporter):
        name = "broken"

        def write(self, result, output_dir):  # noqa: ANN001
            raise KeyError("oops")

    reps = {"broken": Broken(), **_reporters()}
    written, warnings = write_reports(compare_result, reps, list(reps), tmp_path)
    assert set(written) == {"json", "xlsx", "advisor"}
    assert warnings == ["reporter 'broken' failed (KeyError: 'oops'); the broken report is missing, "
                        "the other reports were written"]
