"""The MACA façade with names it did not choose: sequence names from a dump become .pt file names
and report cells; output directories that cannot be used are one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchparity.compat import maca as accuracy
from torchparity.errors import UsageError

EVIL = "=cmd|' /C calc'!A0/../../escape\x00" + "x" * 300


@pytest.fixture
def two_recordings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    x = torch.randn(8)
    with accuracy.record(output_dir="d0", record_level=1):
        torch.exp(x)
    with accuracy.record(output_dir="d1", record_level=1):
        torch.exp(x * 1.01)
    for d in ("d0", "d1"):  # a dump from elsewhere: its sequence name is hostile
        recs = Path(d, "step0", "rank0", "records.jsonl")
        lines = [json.loads(line) for line in recs.read_text().splitlines() if line.strip()]
        for rec in lines:
            if isinstance(rec.get("flags"), dict) and "seq_name" in rec["flags"]:
                rec["flags"]["seq_name"] = EVIL
        recs.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return tmp_path


def test_gen_report_writes_names_as_text(two_recordings):
    from openpyxl import load_workbook

    ws = load_workbook(accuracy.gen_report("d0", "d1", "rep")).active
    cells = [c for row in ws.iter_rows(min_row=2) for c in row if isinstance(c.value, str) and c.value.startswith("=")]
    assert cells, "the hostile name should be in the report"
    assert all(c.data_type == "s" and c.quotePrefix for c in cells)
    assert all("\x00" not in c.value for c in cells)


def test_pt_files_named_after_records_stay_inside_the_directory(two_recordings):
    accuracy._export_pt(Path("d1"))
    files = [p for p in Path(two_recordings).rglob("*.pt")]
    assert any("_cmd_" in p.name and p.parent.name == "d1" for p in files)  # the hostile one, sanitized
    assert all(p.parent in (Path(two_recordings, "d0"), Path(two_recordings, "d1")) for p in files)
    assert all(len(p.name) <= 160 and "\x00" not in p.name and not p.name.startswith(".") for p in files)
    assert not Path(two_recordings, "escape").exists() and not Path(two_recordings).parent.joinpath("escape").exists()


@pytest.mark.parametrize("bad", ["/proc/x", "afile", "nul\x00dir"])
def test_gen_report_unusable_output_dir_is_one_line(two_recordings, bad):
    Path("afile").write_text("x")
    with pytest.raises(UsageError) as e:
        accuracy.gen_report("d0", "d1", bad)
    msg = str(e.value)
    assert "\n" not in msg and "output_dir" in msg and ("cannot be created" in msg or "not a directory" in msg)


def test_gen_report_disk_full_is_one_line_and_leaves_no_partial_file(two_recordings, monkeypatch):
    import errno

    from openpyxl import Workbook

    def full(self, filename):
        Path(filename).write_bytes(b"PK partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Workbook, "save", full)
    with pytest.raises(UsageError, match="No space left on device") as e:
        accuracy.gen_report("d0", "d1", "rep")
    assert "\n" not in str(e.value)
    assert list(Path("rep").iterdir()) == []
