"""Issue 13 items 7-9 (compare side): a summary never contradicts its root cause whatever
checkers are installed, and nothing that could not be compared counts as agreeing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torchparity.compare._testing import mlp_stack_dump, run_cli

NO_CHECKERS = "version: 1\nplugins:\n  disable: [allclose, md5, overflow, grad_direction]\n"


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("honest")
    return {"bench": mlp_stack_dump(root / "bench"), "fault": mlp_stack_dump(root / "fault", fault=("layers.1.act", 1.05)),
            "root": root}


def _summary_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("compared "))


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("torchparity: error:")]


@pytest.mark.parametrize("plugins", [NO_CHECKERS, "version: 1\nplugins:\n  disable: [allclose]\n", None])
def test_root_cause_is_never_beside_zero_errors(synth, tmp_path, plugins) -> None:
    """No checker, only md5/overflow, or the default set: the root cause's output is an error and
    rows nobody judged are 'unchecked', never 'pass'."""
    args = ["compare", str(synth["fault"]), str(synth["bench"]), "--json"]
    if plugins is not None:
        (tmp_path / "p.yaml").write_text(plugins)
        args += ["--plugins", str(tmp_path / "p.yaml")]
    code, text = run_cli(args)
    assert code == 1, text
    payload = json.loads(text[text.index("{"):text.rindex("}") + 1])
    s = payload["summary"]
    assert payload["root_cause"]["name"] == "Aten.gelu.1.forward"
    assert s["n_error"] >= 1, s
    assert s["n_pass"] + s["n_warning"] + s["n_error"] + s["n_skip"] == s["n_rows"]
    if plugins is not None:  # no tolerance checker: the rows carrying the fault's error are not passed
        assert s["n_unchecked"] > 0 and s["n_pass"] < 49, s


def test_no_checker_console_summary(synth, tmp_path) -> None:
    (tmp_path / "p.yaml").write_text(NO_CHECKERS)
    code, text = run_cli(["compare", str(synth["fault"]), str(synth["bench"]), "--plugins", str(tmp_path / "p.yaml")])
    assert code == 1
    line = _summary_line(text)
    assert " 0 error" not in line and "unchecked" in line, line
    assert "root cause: Aten.gelu.1.forward" in text
    code, text = run_cli(["compare", str(synth["bench"]), str(synth["bench"]), "--plugins", str(tmp_path / "p.yaml")])
    assert code == 0 and "the runs agree" in text  # identical dumps: within rounding is a real pass


def _corrupt(src: Path, dst: Path, mutate) -> Path:
    shutil.copytree(src, dst)
    p = dst / "step0" / "rank0" / "records.jsonl"
    lines = p.read_text().splitlines()
    rec = json.loads(lines[2])
    mutate(rec)
    lines[2] = json.dumps(rec)
    p.write_text("\n".join(lines) + "\n")
    return dst


def _set_max_oops(r: dict) -> None:
    r["tensors"][-1]["stats"]["max"] = "oops"


def _drop_stats(r: dict) -> None:
    r["tensors"][-1].pop("stats")


@pytest.mark.parametrize("mutate", [_set_max_oops, _drop_stats], ids=["max_oops", "no_stats"])
@pytest.mark.parametrize("partial", [False, True])
def test_a_statistic_that_could_not_be_read_is_not_a_pass(synth, tmp_path, mutate, partial) -> None:
    dev = _corrupt(synth["bench"], tmp_path / "dev", mutate)
    code, text = run_cli(["compare", str(dev), str(synth["bench"])] + (["--allow-partial"] if partial else []))
    assert code == 2, text
    assert "the runs agree" not in text and "Traceback" not in text
    assert len(_errors(text)) == 1, text
    if "NOT compared" in text:  # the reader let the entry through: compare counts it
        assert "1 NOT compared" in _summary_line(text)
        assert "Aten.gelu.0.forward output.0" in text


def test_not_compared_rows_in_the_api(synth, tmp_path) -> None:
    import torchparity

    dev = _corrupt(synth["bench"], tmp_path / "dev", _set_max_oops)
    res = torchparity.compare(dev, synth["bench"], allow_partial=True)
    s = res.summary
    assert not s["complete"] and (s["n_not_compared"] == 1 or s["n_damaged"] >= 1), s
    assert not res.complete and not res.diverged
    assert torchparity.compare(synth["bench"], synth["bench"]).complete
    row = res.rows[(res.rows["device_name"] == "Aten.gelu.0.forward") & (res.rows["io"] == "output")]
    assert row["verdict"].tolist() != ["pass"]


def test_an_op_that_is_a_list_is_damage_not_a_crash(synth, tmp_path) -> None:
    dev = _corrupt(synth["bench"], tmp_path / "dev", lambda r: r.__setitem__("op", ["aten.gelu", "x"]))
    code, text = run_cli(["compare", str(dev), str(synth["bench"])])
    assert code == 2 and len(_errors(text)) == 1 and "Traceback" not in text, text
    # the reader names the file, the line and the field (compare's own check is the fallback)
    assert ("line 3: op is a list" in text) or ("'op'" in text and "record 2" in text), text
    code, text = run_cli(["compare", str(dev), str(synth["bench"]), "--allow-partial"])
    assert code == 2 and "Traceback" not in text and "the runs agree" not in text, text
    assert "damaged part(s)" in _errors(text)[0]


@pytest.mark.parametrize("option", ["rtol: abc", "rtol: -1", "error_factor: -1", "amplification: abc"])
def test_a_bad_allclose_option_is_refused(synth, tmp_path, option) -> None:
    (tmp_path / "p.yaml").write_text(f"version: 1\ncheckers:\n  - allclose: {{{option}}}\n")
    code, text = run_cli(["compare", str(synth["bench"]), str(synth["bench"]), "--plugins", str(tmp_path / "p.yaml")])
    assert code == 2, text
    errs = _errors(text)
    assert len(errs) == 1 and "allclose" in errs[0] and "p.yaml" in errs[0], text
    assert "no divergence" not in text and "agree" not in text and "compared " not in text


def test_a_truncated_dump_read_with_allow_partial_never_agrees(synth, tmp_path) -> None:
    """--allow-partial compares what was read; without a divergence the exit code is still 2: the
    records lost with the cut line were not compared."""
    dst = tmp_path / "cut"
    shutil.copytree(synth["bench"], dst)
    rank = dst / "step0" / "rank0"
    data = (rank / "records.jsonl").read_bytes()
    keep = data[: data.rindex(b"\n", 0, len(data) - 1) + 1]
    (rank / "records.jsonl").write_bytes(keep + data[len(keep): len(keep) + 40])
    (rank / "footer.json").unlink()
    code, text = run_cli(["compare", str(dst), str(synth["bench"]), "--allow-partial"])
    assert code == 2, text
    assert "the runs agree" not in text and len(_errors(text)) == 1
    assert "damaged part(s) of the dumps were skipped" in _errors(text)[0]


def _dropout_like_dump(path: Path) -> Path:
    """An aten dump whose ops write into uninitialised memory (``empty_like`` + ``copy_``, as
    dropout and many HF layers do): the capture describes those tensors without measuring them."""
    import torch

    import torchparity

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    with torchparity.dump(path, level="aten", mode="statistics"):
        y = lin(x)
        buf = torch.empty_like(y)
        buf.copy_(y * 2)
        buf.sum().backward()
    return path


def test_tensors_neither_dump_measured_are_not_missing_data(tmp_path) -> None:
    """Two identical clean runs agree (exit 0) although uninitialised outputs carry no statistics
    on either side; the same tensor measured on one side only stays 'not compared' (above)."""
    a, b = _dropout_like_dump(tmp_path / "a"), _dropout_like_dump(tmp_path / "b")
    code, text = run_cli(["compare", str(a), str(b)])
    assert code == 0 and "could not be compared" not in text, text
    import torchparity

    res = torchparity.compare(a, b)
    assert res.complete and res.summary["n_not_compared"] == 0
    rows = res.rows[res.rows["op"].astype(object).str.contains("empty_like", na=False) & (res.rows["io"] == "output")]
    assert len(rows) == 1 and rows["verdict"].iat[0] != "pass"  # described, never judged as agreeing


def test_reports_of_an_incomplete_comparison_never_say_no_divergence(synth, tmp_path) -> None:
    """The log and advisor reports say INCOMPLETE, as the CLI's exit 2 does, when part of the dumps
    could not be compared (before: 'no divergence' beside the CLI's error line)."""
    dst = tmp_path / "cut"
    shutil.copytree(synth["bench"], dst)
    rank = dst / "step0" / "rank0"
    data = (rank / "records.jsonl").read_bytes()
    (rank / "records.jsonl").write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1])
    (rank / "footer.json").unlink()
    code, text = run_cli(["compare", str(dst), str(synth["bench"]), "--allow-partial", "-o", str(tmp_path / "out")])
    assert code == 2, text
    assert "INCOMPLETE" in text and "no divergence\n" not in text, text
    advice = (tmp_path / "out" / "advisor.txt").read_text()
    assert "INCOMPLETE" in advice and "No divergence:" not in advice, advice
