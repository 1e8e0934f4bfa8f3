"""Compare rows carry the device op's call stack, and the xlsx report shows it."""

from __future__ import annotations

from pathlib import Path

import torch

import torchparity


def _run(path: Path) -> None:
    with torchparity.dump(str(path), level="api"):  # stacks are on by default at api level
        x = torch.ones(4, 4)
        torch.relu(x @ x).sum()


def test_rows_have_the_device_stack_and_the_xlsx_shows_it(tmp_path: Path) -> None:
    import openpyxl

    _run(tmp_path / "dev")
    _run(tmp_path / "bench")
    res = torchparity.compare(tmp_path / "dev", tmp_path / "bench", output_dir=tmp_path / "out", formats="xlsx")
    frames = res.rows.loc[res.rows["device_name"].str.startswith("Torch.relu"), "stack"].iloc[0]
    assert any("test_stacks.py" in f for f in frames)
    wb = openpyxl.load_workbook(res.reports["xlsx"][0], read_only=True)
    ws = wb[[n for n in wb.sheetnames if n != "Summary"][0]]
    header = [c.value for c in next(ws.iter_rows(max_row=1))]
    col = header.index("NPU_Stack_Info")
    assert any(r[col].value and "test_stacks.py" in r[col].value for r in ws.iter_rows(min_row=2))
