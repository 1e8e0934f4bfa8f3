"""The console reporter: rich tables on a terminal, plain text otherwise; the progress helper."""

from __future__ import annotations

import io

from torchparity.plugins import get_registry
from torchparity_reporter_log import LogReporter, progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _render(result, stream=None, **options) -> str:
    rep = LogReporter()
    rep.configure(options)
    stream = stream if stream is not None else io.StringIO()
    rep.render(result, rep.console(stream), "out")
    return stream.getvalue()


def test_registered_as_plugin():
    assert "log" in get_registry().reporters


def test_divergent_result_plain_text(compare_result):
    out = _render(compare_result)
    assert "\x1b[" not in out  # not a terminal: no colour codes
    rc = compare_result.root_cause
    assert "DIVERGED" in out and rc.name in out and "layers.1.mlp.fc1" in out
    assert "11 error" in out and "2 unmatched" in out
    assert "Top suspects" in out and "error rows" in out
    assert "rel_l2 3.20e-03 > 1e-3" in out  # the reason column is shown
    # the first divergence is completed with the op and module
    assert "first divergence  Aten.mm.6.forward (aten.mm.default) module 'layers.1.mlp.fc1'" in out
    assert max(len(line) for line in out.splitlines()) <= 120


def test_terminal_gets_colours(compare_result):
    out = _render(compare_result, _Tty())
    assert "\x1b[" in out and "DIVERGED" in out


def test_color_never_on_terminal(compare_result):
    assert "\x1b[" not in _render(compare_result, _Tty(), color="never")


def test_agreeing_result(agreeing):
    out = _render(agreeing)
    assert "no divergence" in out and "DIVERGED" not in out and "root cause" not in out


def test_errors_without_root(make_result):
    out = _render(make_result("matmul", errors_without_root=True))
    assert "ERROR ROWS (no root cause named)" in out and "no divergence" not in out
    assert "Aten.gelu.0.forward.output.0" in out


def test_empty_result(empty):
    assert "NOTHING COMPARED" in _render(empty)


def test_nan_values(compare_result):
    rows = compare_result.rows.copy()
    rows.loc[rows["verdict"] == "error", "cosine"] = float("nan")  # NaN metric = not computed
    rows.loc[rows["verdict"] == "error", "rel_l2"] = float("inf")
    compare_result.rows = rows
    compare_result.root_cause.score = float("inf")
    out = _render(compare_result)
    line = next(x for x in out.splitlines() if x.strip().startswith("Aten.mm.6.forward.output.0"))
    assert " - " in line and "inf" in line
    assert "(amplified xinf)" in out


def test_write_returns_no_files(compare_result, tmp_path, capsys):
    assert LogReporter().write(compare_result, tmp_path) == []
    assert "DIVERGED" in capsys.readouterr().out


def test_real_compare(real_compare):
    out = _render(real_compare)
    assert "root cause        Aten.gelu.1.forward (aten.gelu.default) module 'layers.1.act'" in out


def test_progress_is_silent_off_a_terminal():
    items = list(range(5))
    stream = io.StringIO()
    assert progress(items, stream=stream) is items
    assert stream.getvalue() == ""


def test_progress_bar_on_a_terminal(monkeypatch):
    monkeypatch.delenv("TORCHPARITY_NO_PROGRESS", raising=False)
    stream = _Tty()
    assert list(progress(iter(range(50)), total=50, description="comparing", stream=stream)) == list(range(50))
    assert "comparing" in stream.getvalue()
    monkeypatch.setenv("TORCHPARITY_NO_PROGRESS", "1")
    items = [1, 2]
    assert progress(items, stream=_Tty()) is items


def test_big_result_renders_quickly(big):
    out = _render(big)
    assert "100000 rows" in out
