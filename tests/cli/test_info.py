"""`torchparity info`: what a dump holds and what was lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out + cap.err


def test_info_describes_a_dump_and_what_was_lost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "d"
    with torchparity.dump(str(d), level="api"):
        for _ in range(20):
            torch.ones(3).add(1)
    code, text = run_cli(["info", str(d)], capsys)
    assert code == 0 and "step 0 rank 0: 40 records" in text and "complete" in text
    f = d / "step0" / "rank0" / "records.jsonl"
    f.write_bytes(f.read_bytes()[:-40])  # a run killed while writing
    (d / "step0" / "rank0" / "footer.json").unlink()
    code, text = run_cli(["info", str(d), "--json"], capsys)
    info = json.loads(text)
    unit = info["units"][0]
    assert code == 0 and unit["records"] == 39 and unit["complete"] is False
    assert any("truncated" in w for w in unit["lost"])


def test_info_on_a_missing_dump_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli(["info", str(tmp_path / "nope")], capsys)
    assert code == 2 and "does not exist" in text and "Traceback" not in text


def test_info_calls_a_dump_damaged_after_a_clean_close_incomplete(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a new-user check (session 15): a records.jsonl cut in half after the dump closed
    cleanly (its footer intact) was listed as "complete" next to two "lost:" lines."""
    d = tmp_path / "d"
    with torchparity.dump(str(d), level="api"):
        for _ in range(20):
            torch.ones(3).add(1)
    f = d / "step0" / "rank0" / "records.jsonl"
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    code, text = run_cli(["info", str(d)], capsys)
    assert code == 0 and "INCOMPLETE (damaged after a clean close, see lost)" in text and "lost:" in text
    assert " complete" not in text
