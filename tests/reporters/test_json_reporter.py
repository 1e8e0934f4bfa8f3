"""The json reporter: strict JSON, stable keys, round trip, special values, big results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from torchparity.errors import PluginError, UsageError
from torchparity.plugins import get_registry
from torchparity_reporter_json import (
    ROW_COLUMN_ORDER, SCHEMA_VERSION, TOP_LEVEL_KEYS, JsonReporter, load, rows_frame,
)


def _strict(path: Path) -> dict:
    """Parse rejecting the non-standard NaN/Infinity tokens Python's json would accept."""
    def reject(token: str) -> None:
        raise AssertionError(f"bare {token} in {path}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=reject)


def _write(result, tmp_path: Path, **options) -> Path:
    rep = JsonReporter()
    rep.configure(options)
    (path,) = rep.write(result, tmp_path / "out")
    assert path == tmp_path / "out" / "compare.json"
    return path


def test_registered_as_plugin():
    assert "json" in get_registry().reporters


def test_divergent_result_document(compare_result, tmp_path):
    doc = _strict(_write(compare_result, tmp_path))
    assert list(doc) == list(TOP_LEVEL_KEYS)
    assert doc["format"] == "torchparity-compare" and doc["schema_version"] == SCHEMA_VERSION
    assert doc["diverged"] is True
    rc = doc["root_cause"]
    assert rc["name"] == compare_result.root_cause.name and rc["module"] == "layers.1.mlp.fc1"
    assert set(rc) >= {"name", "op", "module", "phase", "step", "rank", "index", "score", "input_error",
                       "output_error", "reason", "kind"}
    assert [s["name"] for s in doc["suspects"]] == [s.name for s in compare_result.suspects]
    assert doc["n_rows"] == doc["rows_written"] == len(doc["rows"]) == len(compare_result.rows)
    # every row has the same keys, documented columns first, in the documented order
    keys = list(doc["rows"][0])
    assert keys == doc["columns"]
    assert all(list(r) == keys for r in doc["rows"])
    documented = [c for c in keys if c in ROW_COLUMN_ORDER]
    assert documented == [c for c in ROW_COLUMN_ORDER if c in keys]
    assert keys[: len(documented)] == documented


def test_agreeing_result(agreeing, tmp_path):
    doc = _strict(_write(agreeing, tmp_path))
    assert doc["diverged"] is False
    assert doc["root_cause"] is None and doc["suspects"] == []
    assert {r["verdict"] for r in doc["rows"]} == {"pass"}


def test_special_values_are_strings_and_round_trip(compare_result, tmp_path):
    path = _write(compare_result, tmp_path)
    doc = _strict(path)
    rows = doc["rows"]
    assert rows[3]["max_rel_err"] == "Infinity"
    assert rows[5]["device_max"] == "NaN" and rows[5]["device_nan"] == 1
    # unmatched rows were not compared: metrics are null, not "NaN"
    um = [r for r in rows if r["match"] == "unmatched"]
    assert um and all(r["cosine"] is None and r["bench_name"] is None for r in um)
    # integers stay integers, lists stay lists
    assert isinstance(rows[0]["step"], int) and rows[0]["device_shape"] == [4, 64]

    loaded = load(path)
    frame = rows_frame(loaded)
    assert math.isinf(frame.loc[3, "max_rel_err"]) and math.isnan(frame.loc[5, "device_max"])
    src = compare_result.rows
    ok = src["match"] != "unmatched"
    assert frame.loc[ok, "cosine"].tolist() == pytest.approx(src.loc[ok, "cosine"].tolist(), rel=0, abs=0)
    assert frame["device_name"].tolist() == src["device_name"].tolist()


def test_rows_option_problems_and_none(compare_result, tmp_path):
    doc = _strict(_write(compare_result, tmp_path, rows="problems"))
    assert doc["n_rows"] == len(compare_result.rows)
    assert doc["rows_written"] == len(doc["rows"]) > 0
    assert all(r["verdict"] in ("warning", "error") or r["match"] == "unmatched" for r in doc["rows"])
    doc = _strict(_write(compare_result, tmp_path, rows="none"))
    assert doc["rows"] == [] and doc["summary"]["n_error"] == compare_result.summary["n_error"]


def test_empty_result(empty, tmp_path):
    doc = _strict(_write(empty, tmp_path))
    assert doc["rows"] == [] and doc["n_rows"] == 0 and doc["diverged"] is False


def test_bad_options_and_output(compare_result, tmp_path):
    rep = JsonReporter()
    with pytest.raises(PluginError, match="rows="):
        rep.configure({"rows": "some"})
    with pytest.raises(PluginError, match="plain file name"):
        rep.configure({"filename": "../x.json"})
    (tmp_path / "file").write_text("x")
    with pytest.raises(PluginError, match="not a directory"):
        JsonReporter().write(compare_result, tmp_path / "file")


def test_load_rejects_invalid_files(tmp_path):
    bad = tmp_path / "compare.json"
    bad.write_text('{"format": "torchparity-compare", "schema_version": 1, "x": NaN}')
    with pytest.raises(UsageError, match="not a valid compare.json"):
        load(bad)
    bad.write_text('{"format": "other"}')
    with pytest.raises(UsageError, match="not a torchparity compare.json"):
        load(bad)
    with pytest.raises(UsageError, match="cannot read"):
        load(tmp_path / "missing.json")


def test_real_compare(real_compare, tmp_path):
    doc = _strict(_write(real_compare, tmp_path))
    assert doc["root_cause"]["name"] == real_compare.root_cause.name
    assert doc["root_cause"]["module"] == "layers.1.act"
    assert len(doc["rows"]) == len(real_compare.rows)


def test_100k_rows(big, tmp_path):
    path = _write(big, tmp_path)
    with open(path, encoding="utf-8") as fh:
        n = sum(1 for line in fh if line.startswith('{"device_name"'))
    assert n == 100_000
