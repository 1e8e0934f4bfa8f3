"""`torchparity demo` (the README's first command) finds the op it planted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchparity.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out + cap.err


def test_demo_names_the_planted_op_and_writes_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    code, text = run_cli(["demo", "-o", str(out), "--steps", "1", "--fault-step", "0",
                          "--fault-module", "layers.0.self_attn.v_proj", "--factor", "1.5"], capsys)
    assert code == 0, text
    assert "Root cause: Aten.mm." in text and "layers.0.self_attn.v_proj" in text
    assert "found - the root cause is the planted op" in text
    data = json.loads((out / "report" / "compare.json").read_text())
    assert data["root_cause"]["module"] == "layers.0.self_attn.v_proj"
    assert (out / "report" / "advisor.txt").exists() and (out / "report" / "compare.xlsx").exists()


def test_demo_rejects_a_fault_outside_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli(["demo", "-o", str(tmp_path / "d"), "--steps", "1", "--fault-step", "3"], capsys)
    assert code == 2
    assert "must be below --steps" in text and "Traceback" not in text
