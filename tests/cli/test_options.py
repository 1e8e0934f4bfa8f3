"""Issue 13: every option of compare/overflow/demo is validated up front - one line, exit 2,
before any work (no dump is read, nothing is written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchparity.compare._testing import mlp_stack_dump, run_cli


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mlp_stack_dump(tmp_path_factory.mktemp("opts") / "d", layers=1, width=8, batch=2)


BAD = [
    (["--threshold", "nan"], "--threshold"), (["--threshold", "inf"], "--threshold"),
    (["--threshold", "0"], "--threshold"), (["--threshold", "-1"], "--threshold"),
    (["-j", "0"], "--workers"), (["-j", "-3"], "--workers"),
    (["--step", "-1"], "--step"), (["--rank", "-1"], "--rank"),
    (["-o", "/proc/torchparity-x"], "--output"),
]


def _one_line(text: str, what: str) -> None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("torchparity: error:"), text
    assert what in lines[0] and "Traceback" not in text


@pytest.mark.parametrize("args,what", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_compare_refuses_bad_options(dump: Path, args: list[str], what: str) -> None:
    code, text = run_cli(["compare", str(dump), str(dump), *args])
    assert code == 2, text
    _one_line(text, what)


def test_compare_output_that_is_a_file(dump: Path, tmp_path: Path) -> None:
    f = tmp_path / "report.txt"
    f.write_text("keep me")
    code, text = run_cli(["compare", str(dump), str(dump), "-o", str(f)])
    assert code == 2
    _one_line(text, "is a file")
    assert f.read_text() == "keep me"


def test_compare_unwritable_output_leaves_nothing_behind(dump: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if (ro / "probe").exists() or _can_write(ro):  # root ignores permissions: nothing to test
            pytest.skip("running as root: permissions are not enforced")
        code, text = run_cli(["compare", str(dump), str(dump), "-o", str(ro / "out")])
        assert code == 2
        _one_line(text, "cannot write")
    finally:
        ro.chmod(0o700)


def test_checking_the_output_creates_nothing(dump: Path, tmp_path: Path) -> None:
    code, text = run_cli(["compare", str(dump), str(dump), "--threshold", "nan", "-o", str(tmp_path / "new" / "o")])
    assert code == 2 and not (tmp_path / "new").exists()


def _can_write(d: Path) -> bool:
    try:
        (d / ".w").write_text("")
        (d / ".w").unlink()
        return True
    except OSError:
        return False


def test_compare_output_is_checked_before_reading(tmp_path: Path) -> None:
    """-o is validated before the dumps are opened (missing dumps would be the later error)."""
    code, text = run_cli(["compare", str(tmp_path / "nope"), str(tmp_path / "nope"), "-o", "/proc/torchparity-x"])
    assert code == 2
    _one_line(text, "--output")


@pytest.mark.parametrize("args,what", [(["--step", "-2"], "--step"), (["--rank", "-1"], "--rank"),
                                       (["-o", "/proc/torchparity-x"], "--output")])
def test_overflow_refuses_bad_options(dump: Path, args: list[str], what: str) -> None:
    code, text = run_cli(["overflow", str(dump), *args])
    assert code == 2, text
    _one_line(text, what)


@pytest.mark.parametrize("args,what", [(["--factor", "nan"], "--factor"), (["--factor", "1"], "--factor"),
                                       (["--fault-step", "-1"], "--fault-step"),
                                       (["-o", "/proc/torchparity-x"], "--output")])
def test_demo_refuses_bad_options(args: list[str], what: str) -> None:
    code, text = run_cli(["demo", *args])
    assert code == 2, text
    _one_line(text, what)


def test_an_unknown_option_is_one_line() -> None:
    code, text = run_cli(["compare", "--bogus"])
    assert code == 2
    _one_line(text, "--bogus")


@pytest.mark.parametrize("body, what", [
    (b"version: 1\nplugins: 5\n", "'plugins' must be a mapping"),
    (b"version: 1\nplugins:\n  disable: 5\n", "disable"),
    (b"\x00\xff\xfe binary \x89PNG", "not a text file"),
], ids=["plugins-5", "disable-5", "binary"])
def test_a_plugins_yaml_of_the_wrong_type_is_one_line(dump: Path, tmp_path: Path, body: bytes, what: str) -> None:
    """Issue 13 item 9: ``plugins: 5`` was a TypeError traceback, a binary file a UnicodeDecodeError."""
    cfg = tmp_path / "p.yaml"
    cfg.write_bytes(body)
    code, text = run_cli(["--plugins", str(cfg), "compare", str(dump), str(dump)])
    assert code == 2 and "Traceback" not in text
    _one_line(text, what)
    assert "p.yaml" in text
