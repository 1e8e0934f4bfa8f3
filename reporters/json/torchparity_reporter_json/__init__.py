"""torchparity JSON reporter: writes ``OUT/compare.json``.

The file is strict JSON (RFC 8259): non-finite floats are written as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` (as in dumps, see :func:`torchparity.records.encode_float`),
never as bare tokens, so any JSON parser reads it. The schema is versioned
(:data:`SCHEMA_VERSION`) and documented in ``docs/reports.md``; adding a key does not bump the
version, renaming or removing one does.

Layout (keys always present, in this order)::

    {"format": "torchparity-compare", "schema_version": 1, "generator": {...},
     "diverged": true, "summary": {...}, "root_cause": {...} | null, "suspects": [...],
     "columns": [...], "n_rows": 123, "rows_written": 123, "rows": [{...}, ...]}

Rows are written one object per line (easy to ``grep``), from column arrays rather than per-cell
Python, so 100k rows take about a second.

Nothing heavy is imported at module level: pandas and numpy are imported inside methods so plugin
discovery stays fast.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from torchparity import hookimpl
from torchparity.plugin_types import prepare_output_dir, write_atomically
from torchparity.errors import PluginError, UsageError
from torchparity.plugin_types import Reporter

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from torchparity.results import CompareResult

__version__ = "0.1.0"

FORMAT_NAME = "torchparity-compare"
SCHEMA_VERSION = 1

#: Top-level keys, always present, in this order.
TOP_LEVEL_KEYS = (
    "format", "schema_version", "generator", "diverged", "summary", "root_cause", "suspects",
    "columns", "n_rows", "rows_written", "rows",
)

#: Documented row columns (``torchparity.results``), in the order they are written. Columns the
#: result does not have are left out (the ``columns`` key lists what each row carries); columns
#: not in this list are written after these, in the frame's order.
ROW_COLUMN_ORDER = (
    # identity
    "device_name", "bench_name", "tensor", "op", "module", "phase", "step", "rank", "order", "io",
    "match",
    # description
    "device_dtype", "bench_dtype", "device_shape", "bench_shape",
    # judgement
    "verdict", "reason", "checker", "error",
    # tensor metrics
    "cosine", "max_abs_err", "max_rel_err", "mean_rel_err", "rmse", "euc_dist",
    "one_thousandth_ratio", "five_thousandth_ratio", "worst_index", "rel_l2",
    # statistics
    "device_max", "device_min", "device_mean", "device_norm",
    "bench_max", "bench_min", "bench_mean", "bench_norm",
    "max_diff", "min_diff", "mean_diff", "norm_diff",
    "max_rel_diff", "min_rel_diff", "mean_rel_diff", "norm_rel_diff",
    "device_nan", "device_inf", "bench_nan", "bench_inf", "nonfinite_mismatch",
    # checksums
    "device_md5", "bench_md5", "md5_equal",
    # provenance
    "stack",
)

#: Columns written as integers (null where missing) even when missing values made them floats.
INT_COLUMNS = frozenset({"step", "rank", "order", "worst_index", "device_nan", "device_inf", "bench_nan", "bench_inf"})
#: Columns that are not numbers: a missing value is null, never "NaN".
NON_FLOAT_COLUMNS = frozenset({
    "device_name", "bench_name", "tensor", "op", "module", "phase", "io", "match", "device_dtype",
    "bench_dtype", "device_shape", "bench_shape", "verdict", "reason", "checker", "stack",
    "device_md5", "bench_md5", "md5_equal", "nonfinite_mismatch",
})

ROWS_CHOICES = ("all", "problems", "none")
_CHUNK = 20_000


# ------------------------------------------------------------------------------------------
# encoding helpers
# ------------------------------------------------------------------------------------------


def encode_float(x: float) -> float | str:
    """A float as strict JSON: finite floats as numbers, others as strings."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def jsonable(obj: Any) -> Any:
    """Convert ``obj`` (recursively) to plain JSON values (slow path, for small structures).

    numpy scalars and arrays become Python numbers and lists, non-finite floats become strings,
    pandas missing values become ``None``, paths and dates become strings, dataclasses dicts.
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return encode_float(obj)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    mod = type(obj).__module__
    if mod == "numpy" or mod.startswith("numpy."):
        if hasattr(obj, "tolist"):
            return jsonable(obj.tolist())
    if mod.startswith("pandas"):
        try:
            import pandas as pd

            if obj is pd.NA or obj is pd.NaT:
                return None
            if isinstance(obj, pd.Timestamp):
                return obj.isoformat()
        except Exception:  # pragma: no cover - pandas internals
            pass
    if hasattr(obj, "to_dict"):
        try:
            return jsonable(obj.to_dict())
        except Exception:  # pragma: no cover
            pass
    return str(obj)


def _default(obj: Any) -> Any:
    """``json`` fallback for objects the fast path left in rows (lists of numpy ints etc.)."""
    out = jsonable(obj)
    if out is obj:  # pragma: no cover - jsonable always converts
        return str(obj)
    return out


def _column_values(s: pd.Series, name: str = "") -> list[Any]:
    """One frame column as a list of JSON-ready values, vectorised where the dtype allows.

    Metric columns (floats): non-finite values become "NaN"/"Infinity"/"-Infinity". Integer
    columns that missing values turned into floats are written as integers again (missing: null).
    Text/bool columns: missing values are null.
    """
    import numpy as np
    import pandas as pd
    from pandas.api import types as pdt

    if pdt.is_bool_dtype(s.dtype) and not s.hasnans:
        return s.to_numpy(dtype=bool).tolist()
    if pdt.is_integer_dtype(s.dtype) and not s.hasnans:
        return s.to_numpy(dtype=np.int64).tolist()
    if pdt.is_float_dtype(s.dtype) and name in INT_COLUMNS:
        arr = s.to_numpy(dtype=np.float64, na_value=np.nan)
        finite = np.isfinite(arr)
        if np.array_equal(arr[finite], np.round(arr[finite])):
            obj = np.full(len(arr), None, dtype=object)
            obj[finite] = arr[finite].astype(np.int64).astype(object)
            return obj.tolist()
    if pdt.is_float_dtype(s.dtype) and name not in NON_FLOAT_COLUMNS:
        arr = s.to_numpy(dtype=np.float64, na_value=np.nan)
        finite = np.isfinite(arr)
        if finite.all():
            return arr.tolist()
        obj = arr.astype(object)
        obj[np.isnan(arr)] = "NaN"
        obj[np.isposinf(arr)] = "Infinity"
        obj[np.isneginf(arr)] = "-Infinity"
        return obj.tolist()
    # object, strings, categoricals, nullable ints/bools: missing -> None, the rest as is
    obj = s.astype(object).to_numpy(copy=True)
    try:
        missing = pd.isna(s).to_numpy(dtype=bool)
    except Exception:  # pragma: no cover - exotic extension types
        missing = np.zeros(len(obj), dtype=bool)
    if missing.any():
        obj[missing] = None
    return obj.tolist()


def _ordered_columns(columns: list[str]) -> list[str]:
    known = [c for c in ROW_COLUMN_ORDER if c in columns]
    rest = [c for c in columns if c not in ROW_COLUMN_ORDER]
    return known + rest


def iter_row_chunks(rows: pd.DataFrame, chunk: int = _CHUNK) -> Iterator[list[dict[str, Any]]]:
    """The frame's rows as lists of JSON-ready dicts, ``chunk`` rows at a time."""
    if not all(isinstance(c, str) for c in rows.columns):
        rows = rows.rename(columns=str)
    columns = _ordered_columns(list(rows.columns))
    for start in range(0, len(rows), chunk):
        part = rows.iloc[start:start + chunk]
        values = [_column_values(part[c], c) for c in columns]
        if "match" in columns:
            # unmatched rows were not compared: their metrics are null, not "NaN"
            unmatched = part["match"].astype(object).eq("unmatched").to_numpy(dtype=bool)
            if unmatched.any():
                for i, c in enumerate(columns):
                    if c not in NON_FLOAT_COLUMNS and c not in INT_COLUMNS and not c.startswith("device_"):
                        values[i] = [None if u else v for v, u in zip(values[i], unmatched)]
        yield [dict(zip(columns, tup)) for tup in zip(*values)]


def _encode_rows(records: list[dict[str, Any]], encoder: json.JSONEncoder) -> str:
    try:
        return ",\n".join(encoder.encode(r) for r in records)
    except ValueError:
        # a non-finite float hidden in an object column (e.g. inside a list): slow path
        return ",\n".join(encoder.encode(jsonable(r)) for r in records)


# ------------------------------------------------------------------------------------------
# the document
# ------------------------------------------------------------------------------------------


def _empty_frame() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame()


def _select_rows(rows: pd.DataFrame, which: str) -> pd.DataFrame:
    if which == "none" or rows.empty:
        return rows.iloc[0:0]
    if which == "problems":
        mask = None
        if "verdict" in rows.columns:
            mask = rows["verdict"].astype(object).isin(["warning", "error"])
        if "match" in rows.columns:
            unmatched = rows["match"].astype(object).eq("unmatched")
            mask = unmatched if mask is None else (mask | unmatched)
        return rows if mask is None else rows[mask.fillna(False).astype(bool)]
    return rows


def header_document(result: CompareResult, rows_written: int, columns: list[str]) -> dict[str, Any]:
    """Everything but ``rows``, as plain JSON values."""
    from torchparity import __version__ as core_version

    rows = result.rows if result.rows is not None else _empty_frame()
    try:
        diverged = bool(result.diverged)
    except Exception:
        diverged = result.root_cause is not None
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "generator": {
            "name": "torchparity",
            "version": core_version,
            "reporter": "torchparity-reporter-json",
            "reporter_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
        "diverged": diverged,
        "summary": jsonable(dict(result.summary or {})),
        "root_cause": jsonable(result.root_cause.to_dict()) if result.root_cause is not None else None,
        "suspects": [jsonable(s.to_dict()) for s in (result.suspects or [])],
        "columns": columns,
        "n_rows": int(len(rows)),
        "rows_written": int(rows_written),
    }




def write_compare_json(
    result: CompareResult, path: Path, *, rows: str = "all", indent: int | None = 1
) -> Path:
    """Write ``result`` to ``path`` (atomically: a temporary file renamed into place)."""
    frame = result.rows if result.rows is not None else _empty_frame()
    selected = _select_rows(frame, rows)
    columns = _ordered_columns([str(c) for c in frame.columns])
    header = header_document(result, len(selected), columns)
    encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=False, default=_default, separators=(",", ":"))
    pretty = json.JSONEncoder(allow_nan=False, ensure_ascii=False, default=_default, indent=indent)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write("{\n")
            for key in TOP_LEVEL_KEYS[:-1]:
                enc = encoder if key == "columns" else pretty
                fh.write(f"{json.dumps(key)}: {enc.encode(header[key])},\n")
            fh.write('"rows": [')
            first = True
            for records in iter_row_chunks(selected):
                if not records:
                    continue
                fh.write("\n" if first else ",\n")
                fh.write(_encode_rows(records, encoder))
                first = False
            fh.write("\n]\n}\n" if not first else "]\n}\n")

    return write_atomically(path, path.with_name(path.name + ".tmp"), "json", write)


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON token {token!r}")


def load(path: Path | str) -> dict[str, Any]:
    """Read a ``compare.json`` strictly (bare NaN/Infinity tokens are rejected).

    Raises :class:`~torchparity.errors.UsageError` for a missing, unreadable or invalid file.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise UsageError(f"{p} is not a valid compare.json: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise UsageError(f"{p} is not a torchparity compare.json (no 'format': '{FORMAT_NAME}')")
    if int(doc.get("schema_version", 0)) > SCHEMA_VERSION:
        raise UsageError(
            f"{p} has schema_version {doc.get('schema_version')}; this reader knows up to {SCHEMA_VERSION}: upgrade torchparity-reporter-json"
        )
    return doc


def rows_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """The ``rows`` of a loaded document as a DataFrame, with "NaN"/"Infinity" strings decoded
    back to floats in numeric columns."""
    import pandas as pd

    frame = pd.DataFrame.from_records(list(doc.get("rows") or []), columns=list(doc.get("columns") or []) or None)
    special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    for col in frame.columns:
        s = frame[col]
        if s.dtype == object:
            vals = s.dropna()
            if len(vals) and all((isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, str) and v in special) for v in vals):
                frame[col] = pd.to_numeric(s.replace(special), errors="coerce")
    return frame


# ------------------------------------------------------------------------------------------
# the plugin
# ------------------------------------------------------------------------------------------


class JsonReporter(Reporter):
    """``OUT/compare.json``: summary, root cause, suspects and every compared row."""

    name = "json"
    description = "OUT/compare.json: summary, root cause, suspects and rows (strict JSON, schema_version 1)"

    @dataclass
    class Options:
        #: file name inside the output directory
        filename: str = "compare.json"
        #: which rows to write: all | problems (warning, error, unmatched) | none
        rows: str = "all"
        #: indentation of the summary/suspects sections (rows are always one object per line);
        #: null for the most compact file
        indent: int | None = 1

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        if self.options.rows not in ROWS_CHOICES:
            raise PluginError(
                f"reporter 'json': option rows={self.options.rows!r} is not one of {', '.join(ROWS_CHOICES)}"
            )
        if not self.options.filename or Path(self.options.filename).name != self.options.filename:
            raise PluginError(f"reporter 'json': option filename={self.options.filename!r} must be a plain file name")

    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write ``compare.json`` into ``output_dir``; return ``[path]``."""
        out = prepare_output_dir(output_dir, self.name)
        return [write_compare_json(result, out / self.options.filename, rows=self.options.rows, indent=self.options.indent)]


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield JsonReporter()
