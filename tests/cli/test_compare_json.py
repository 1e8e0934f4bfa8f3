"""`torchparity compare --json`: stdout holds the JSON alone, also when reports are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.cli import main


def _dump(path: Path) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    with torchparity.dump(str(path), model=lin, level="aten"):
        lin(torch.ones(2, 4)).sum().backward()


def test_json_with_an_output_dir_keeps_the_console_summary_off_stdout(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a new-user check (session 15): with -o the console reporter printed its panel on
    stdout before the JSON, so ``compare ... --json > out.json`` wrote a file no parser reads."""
    _dump(tmp_path / "a")
    _dump(tmp_path / "b")
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out"), "--json"])
    cap = capsys.readouterr()
    assert int(exc.value.code or 0) == 0
    data = json.loads(cap.out)  # the JSON alone
    assert data["root_cause"] is None and data["summary"]["n_error"] == 0
    assert "torchparity compare" in cap.err  # the panel still shows, on stderr
    assert (tmp_path / "out").is_dir()
