"""docs/cli.md is the CLI's own --help text: the two never drift apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_matches_help_texts() -> None:
    p = subprocess.run([sys.executable, str(ROOT / ".ci" / "gen_cli_docs.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_every_command_has_help_with_an_example() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    sections = text.split("\n## torchparity ")[1:]
    assert len(sections) >= 6
    for sec in sections:
        name = sec.split("\n", 1)[0]
        if name != "plugins":
            assert "torchparity " + name in sec.split("```", 2)[1].split("Options:")[0], f"{name}: no example in --help"
