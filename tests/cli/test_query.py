"""``torchparity query`` and ``torchparity compact``: SQL over every rank and step of a dump's
Parquet summaries, CSV/JSON for scripts, one-line errors (exit 2) for bad SQL and missing or
damaged summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")



def _synth(root: Path, steps: int = 2, ranks: int = 3, records: int = 5, nan_at: tuple[int, int] = (1, 2)) -> Path:
    """A small JSONL dump written by hand (no summaries): ``records`` linear ops per step/rank,
    the output max = 10*step + rank + id; one NaN output at ``nan_at`` (step, rank)."""
    (root).mkdir(parents=True)
    (root / "torchparity.json").write_text(json.dumps({"format": "torchparity-dump", "version": 1}))
    for s in range(steps):
        for r in range(ranks):
            d = root / f"step{s}" / f"rank{r}"
            d.mkdir(parents=True)
            (d / "header.json").write_text(json.dumps({"step": s, "rank": r, "level": "api", "mode": "statistics"}))
            lines = []
            for i in range(records):
                mx = float(10 * s + r + i)
                nan = int((s, r) == nan_at and i == 2)
                lines.append(json.dumps({
                    "id": i, "name": f"Functional.linear.{i}.forward", "op": "torch.nn.functional.linear",
                    "level": "api", "phase": "forward", "module": f"layers.{i % 2}", "call_index": i, "step": s,
                    "rank": r, "fwd": None, "stack": None, "tensors": [
                        {"io": "input", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [2, 4],
                         "stride": [4, 1], "device": "cpu", "requires_grad": False,
                         "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 2.0, "nan": 0, "inf": 0}},
                        {"io": "output", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [2, 4],
                         "stride": [4, 1], "device": "cpu", "requires_grad": False,
                         "stats": {"max": "NaN" if nan else mx, "min": 0.0, "mean": 1.0, "norm": 3.0,
                                   "nan": nan, "inf": 0}}]}))
            (d / "records.jsonl").write_text("\n".join(lines) + "\n")
            (d / "footer.json").write_text(json.dumps({"complete": True, "records": records}))
    return root


def _run(*args: str) -> tuple[int, str, str]:
    """``torchparity ARGS`` in this process (the console entry point: exit code, stdout, stderr)."""
    import contextlib
    import io

    from torchparity.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def test_query_writes_missing_summaries_first_and_leaves_out_unfinished_units(tmp_path: Path, caplog) -> None:
    """Dumps are written with summaries="off" by default: the first query writes them (finished
    units only: one without footer.json may still be written to), says so, and answers."""
    root = _synth(tmp_path / "d")
    (root / "step1" / "rank2" / "footer.json").unlink()  # still being written
    with caplog.at_level("WARNING", logger="torchparity"):
        rc, out, err = _run("query", str(root), "SELECT step, rank, count(*) AS n FROM ops GROUP BY ALL ORDER BY ALL",
                            "--format", "csv")
    assert rc == 0, err
    assert out.splitlines() == ["step,rank,n"] + [f"{s},{r},5" for s in range(2) for r in range(3) if (s, r) != (1, 2)]
    assert "wrote the Parquet summaries of 5 step/rank(s)" in caplog.text
    footer = json.loads((root / "step0" / "rank0" / "footer.json").read_text())
    assert footer["summary"] is True and "summary_error" not in footer and footer["complete"] is True
    assert "1 step/rank directory without a current summary (step1/rank2)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="torchparity"):  # the second query writes nothing
        rc, out, err = _run("query", str(root), "SELECT count(*) AS n FROM ops", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["n", "25"] and "wrote the Parquet" not in caplog.text


def test_query_says_why_when_the_summaries_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    from torchparity.dump import columnar

    root = _synth(tmp_path / "d")
    real_write = columnar._write_atomic

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(columnar, "_write_atomic", disk_full)
    rc, out, err = _run("query", str(root), "SELECT 1")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "No space left on device" in err and "copy the dump to a writable place" in err
    assert "Traceback" not in err
    monkeypatch.setattr(columnar, "_write_atomic", real_write)
    rc, out, err = _run("query", str(root), "SELECT count(*) AS n FROM ops", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["n", "30"], err


def test_compact_then_query_every_rank_and_step(tmp_path: Path) -> None:
    root = _synth(tmp_path / "d")
    rc, out, err = _run("compact", str(root))
    assert rc == 0 and "summaries written for 6 step/rank(s) (30 records" in out, out + err
    rc, out, _ = _run("compact", str(root))
    assert rc == 0 and "written for 0 step/rank(s)" in out and "6 already up to date" in out
    rc, out, err = _run("query", str(root), "SELECT step, rank, count(*) AS n FROM ops GROUP BY ALL ORDER BY ALL",
                        "--format", "csv")
    assert rc == 0, err
    assert out.splitlines() == ["step,rank,n"] + [f"{s},{r},5" for s in range(2) for r in range(3)]
    # first step with a NaN on any rank, and where
    rc, out, _ = _run("query", str(root), "SELECT step, rank, name FROM tensors WHERE nan > 0 ORDER BY step, rank, seq",
                      "--format", "json")
    assert rc == 0 and [json.loads(x) for x in out.splitlines()] == [
        {"step": 1, "rank": 2, "name": "Functional.linear.2.forward"}]
    # largest max per module across ranks (modules view)
    rc, out, _ = _run("query", str(root), "SELECT module, max(max) AS m, arg_max(rank, max) AS r FROM modules "
                      "WHERE nan = 0 GROUP BY module ORDER BY module", "--format", "csv")
    assert out.splitlines() == ["module,m,r", "layers.0,15.0,1", "layers.1,15.0,2"]
    rc, out, _ = _run("query", str(root), "SELECT count(*) AS n FROM tensors")
    assert rc == 0 and out.split() == ["n", "60"]


def test_bad_sql_and_damaged_summary_are_one_line_errors(tmp_path: Path) -> None:
    root = _synth(tmp_path / "d", steps=1, ranks=2)
    assert _run("compact", str(root))[0] == 0
    rc, out, err = _run("query", str(root), "SELEC * FROM ops")
    assert rc == 2 and err.count("\n") == 1 and "syntax error" in err and "Traceback" not in err
    rc, out, err = _run("query", str(root), "SELECT * FROM nope")
    assert rc == 2 and err.count("\n") == 1 and "tables: ops, tensors, modules" in err
    part = root / "summary/tensors/step=0/rank=1/part.parquet"
    part.write_bytes(part.read_bytes()[:40])
    rc, out, err = _run("query", str(root), "SELECT count(*) FROM tensors")
    assert rc == 2 and err.count("\n") == 1 and f"torchparity compact {root}" in err and "Traceback" not in err
    rc, out, err = _run("compact", str(root))  # compact sees the damaged summary and rewrites it
    assert rc == 0 and "written for 1 step/rank(s)" in out
    rc, out, _ = _run("query", str(root), "SELECT count(*) AS n FROM tensors", "--format", "csv")
    assert out.split() == ["n", "20"]


def test_python_api_returns_a_dataframe(tmp_path: Path) -> None:
    import torchparity

    root = _synth(tmp_path / "d", steps=1, ranks=2)
    rep = torchparity.compact(root)
    assert sorted(rep.written) == ["step0/rank0", "step0/rank1"]
    df = torchparity.query(root, "SELECT rank, sum(tensors) AS t FROM ops GROUP BY rank ORDER BY rank")
    assert df.to_dict("list") == {"rank": [0, 1], "t": [10, 10]}


def test_query_rewrites_a_summary_the_dump_appended_to_since(tmp_path: Path) -> None:
    """A summary older than its records.jsonl (records appended after a query) is checked and
    rewritten before the query reads it: the answer counts every record."""
    import os

    root = _synth(tmp_path / "d", steps=1, ranks=1)
    rc, out, _ = _run("query", str(root), "SELECT count(*) AS n FROM ops", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["n", "5"]
    rec = root / "step0" / "rank0" / "records.jsonl"
    lines = rec.read_text().splitlines()
    rec.write_text("\n".join(lines + [lines[0].replace('"id": 0', '"id": 5')]) + "\n")
    later = rec.stat().st_mtime_ns + 10**9
    os.utime(rec, ns=(later, later))  # a coarse clock must not hide the change
    rc, out, err = _run("query", str(root), "SELECT count(*) AS n FROM ops", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["n", "6"], err


def test_a_stale_summary_that_cannot_be_rewritten_is_left_out(tmp_path: Path, caplog) -> None:
    import os

    root = _synth(tmp_path / "d", steps=2, ranks=1)
    assert _run("query", str(root), "SELECT 1")[0] == 0
    (root / "step1" / "rank0" / "footer.json").unlink()  # being written to again
    rec = root / "step1" / "rank0" / "records.jsonl"
    rec.write_text(rec.read_text() + rec.read_text().splitlines()[0] + "\n")
    later = rec.stat().st_mtime_ns + 10**9
    os.utime(rec, ns=(later, later))
    with caplog.at_level("WARNING", logger="torchparity"):
        rc, out, err = _run("query", str(root), "SELECT step, count(*) AS n FROM ops GROUP BY step", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["step,n", "0,5"], err  # not step 1's stale 5
    assert "without a current summary (step1/rank0)" in caplog.text


def test_a_value_pyarrow_refuses_is_a_one_line_error(tmp_path: Path) -> None:
    root = _synth(tmp_path / "d", steps=1, ranks=1)
    rec = root / "step0" / "rank0" / "records.jsonl"
    rec.write_text(rec.read_text().replace("layers.0", "layers.\\ud800"))  # a lone surrogate in a module path
    rc, out, err = _run("query", str(root), "SELECT 1")
    assert rc == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1
    assert "could not be summarized" in err


def test_compact_with_two_workers_writes_what_one_writes(tmp_path: Path) -> None:
    import shutil

    from torchparity.dump import columnar
    from torchparity.dump.compact import compact

    one = _synth(tmp_path / "one", steps=2, ranks=2)
    two = tmp_path / "two"
    shutil.copytree(one, two)
    r1, r2 = compact(one, workers=1), compact(two, workers=2)
    assert sorted(r1.written) == sorted(r2.written) == [f"step{s}/rank{r}" for s in range(2) for r in range(2)]
    assert r1.records == r2.records == 20 and r2.failed == []
    for t in columnar.TABLES:
        for s in range(2):
            for r in range(2):
                a = columnar.part_path(one, t, s, r).read_bytes()
                b = columnar.part_path(two, t, s, r).read_bytes()
                assert a == b, (t, s, r)

