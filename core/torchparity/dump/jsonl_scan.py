"""Reading JSON Lines files of a dump: ``records.jsonl`` chunk by chunk (bad lines skipped and
named as :class:`~.damage.Damage`), other ``*.jsonl`` files line by line. Shared by the reader
(:mod:`.reader`) and the columnar summaries (:mod:`.columnar`), which import nothing of each other's
through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .damage import Damage


def _iter_jsonl(path: Path, warnings: list[str]) -> Iterable[Any]:
    if not path.is_file():
        return
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc}")
        return
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


try:  # orjson parses records.jsonl 3-5x faster than the standard library (same strict JSON)
    from orjson import loads as _orjson_loads

    def _fast_loads(line: bytes) -> Any:
        try:
            return _orjson_loads(line)
        except ValueError:  # NaN/Infinity literals from other writers: the standard parser takes them
            return json.loads(line)
except ImportError:  # pragma: no cover - orjson is a dependency; stay usable without it
    _orjson_loads = None
    _fast_loads = json.loads


#: lines parsed and flattened at a time: the dicts of a chunk are still in the CPU cache when the
#: flattening reads them and when they are freed (whole-file parsing, then flattening, is ~2x slower)
CHUNK_LINES = 200


def _parse_clean(lines: list[bytes]) -> list[dict[str, Any]] | None:
    """Every line parsed in one C-level pass, or None when any line is not a plain record (a blank,
    truncated or corrupt line, NaN literals): then the line-by-line parser reports what it finds."""
    if _orjson_loads is None:
        return None
    try:
        records = list(map(_orjson_loads, lines))
    except ValueError:
        return None
    if all(type(r) is dict and ("tensors" in r or "id" in r) for r in records):
        return records
    return None


def _scan_records(path: Path, rel: str, warnings: list[str],
                  sink: Callable[[list[dict[str, Any]], Sequence[int]], None]) -> int:
    """Parse records.jsonl chunk by chunk, handing each chunk of good records and their 1-based
    line numbers to ``sink`` (in file order); bad lines are skipped and reported in ``warnings``.
    Returns the records read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        warnings.append(Damage(f"cannot read {rel}/records.jsonl ({exc}); no records from this rank"))
        return 0
    lines = data.split(b"\n")
    del data
    ends_with_newline = not lines[-1]
    if ends_with_newline:
        lines.pop()
    n = len(lines)
    count = 0
    bad: list[int] = []
    truncated = False
    loads = _fast_loads
    for start in range(0, n, CHUNK_LINES):
        chunk = lines[start:start + CHUNK_LINES]
        records = _parse_clean(chunk)
        numbers: Sequence[int] = range(start + 1, start + 1 + len(chunk))
        if records is None:  # line by line: keep every good line, note the bad ones
            records = []
            numbers = []
            for i, line in enumerate(chunk, start):
                if not line.strip():
                    continue
                try:
                    obj = loads(line)
                    if not isinstance(obj, dict) or "tensors" not in obj and "id" not in obj:
                        raise ValueError("not a record")
                    records.append(obj)
                    numbers.append(i + 1)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    if i == n - 1 and not ends_with_newline:
                        truncated = True
                    else:
                        bad.append(i + 1)
        count += len(records)
        sink(records, numbers)
    if truncated:
        warnings.append(Damage(
            f"{rel}/records.jsonl: read {count} records, the last line was truncated: the "
            f"process probably died while writing; the records after it are lost"
        ))
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.append(Damage(
            f"{rel}/records.jsonl: {len(bad)} corrupt line(s) skipped (line {shown}); read "
            f"{count} records - the file was damaged after writing (disk full, copy error?)"
        ))
    return count
