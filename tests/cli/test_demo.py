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


@pytest.mark.parametrize("level", ["module", "api", "aten", "mix"])
def test_demo_finds_the_planted_op_at_every_level(level: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13 item 3: module/api/mix dumps record no aten op; the call that contains the planted
    ``aten.mm`` (its Linear module, its functional.linear) is what they can name, and is found."""
    code, text = run_cli(["demo", "-o", str(tmp_path / "d"), "--steps", "1", "--fault-step", "0", "--level", level],
                         capsys)
    assert code == 0, text
    assert "module:   layers.1.mlp.down_proj" in text
    assert "Verdict:    found" in text and "NOT found" not in text
    want = {"aten": "Aten.mm.", "module": "Module.layers.1.mlp.down_proj.Linear.forward",
            "api": "Functional.linear.", "mix": "Functional.linear."}[level]
    assert f"Root cause: {want}" in text


def test_demo_verdict_is_not_found_elsewhere() -> None:
    """The verdict still says NOT found for a root cause in another module, phase or step, or (at
    aten level) another op."""
    from torchparity.demo import DemoFault, is_planted
    from torchparity.results import Suspect

    f = DemoFault()

    def s(**kw: object) -> Suspect:
        base = dict(name="x", op="torch.nn.functional.linear", module=f.module, phase=f.phase, step=f.step, rank=0,
                    index=0, score=1e4, input_error=0.0, output_error=0.05, reason="", level="api")
        base.update(kw)
        return Suspect(**base)  # type: ignore[arg-type]

    assert is_planted(s(), f, "mix") and is_planted(s(level="module", op="Linear"), f, "module")
    assert not is_planted(None, f, "mix")
    assert not is_planted(s(module="layers.0.mlp.down_proj"), f, "mix")
    assert not is_planted(s(phase="backward"), f, "api")
    assert not is_planted(s(step=0), f, "module")
    assert is_planted(s(op="aten.mm.default", level="aten"), f, "aten")
    assert not is_planted(s(op="aten.addmm.default", level="aten"), f, "aten")
    assert not is_planted(s(), f, "aten")
