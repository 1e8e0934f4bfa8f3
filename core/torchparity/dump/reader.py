"""Read a dump (torchparity or msprobe) into a pandas DataFrame, one row per tensor entry.

The reader never unpickles: torchparity tensors are safetensors, msprobe ``.pt`` files are read
with ``torch.load(weights_only=True)`` and only when a row's tensor is actually loaded.

Robustness is part of the contract (``docs/dump-format.md``): a truncated last line, a corrupt
line in the middle, a missing ``footer.json`` or ``header.json``, a truncated msprobe ``dump.json``
all produce a warning in ``df.attrs["warnings"]`` (and in :attr:`DumpReader.warnings`) saying
what was read, what was lost and what to do, and the rest of the dump is still returned. A path
that holds no dump at all raises :class:`~torchparity.errors.DumpError`.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import DumpError

log = logging.getLogger("torchparity")

RECORD_COLUMNS = [
    "record_id", "name", "op", "level", "phase", "module", "module_class", "call_index", "step",
    "rank", "fwd", "stack", "flags",
]
TENSOR_COLUMNS = [
    "io", "arg", "kind", "dtype", "shape", "stride", "device", "requires_grad", "max", "min",
    "mean", "norm", "nan", "inf", "md5", "value", "file", "key", "producer",
]
COLUMNS = RECORD_COLUMNS + TENSOR_COLUMNS + ["tensor"]
#: the columns ``torchparity.compare`` reads (``read_unit(..., compact=True)``): building only
#: these makes reading a big statistics dump ~25 % faster
COMPARE_COLUMNS = [
    "record_id", "name", "op", "level", "phase", "module", "call_index", "fwd", "stack", "io", "arg", "kind",
    "dtype", "shape", "requires_grad", "max", "min", "mean", "norm", "nan", "inf", "md5", "value", "producer",
    "tensor",
]
STAT_COLUMNS = ("max", "min", "mean", "norm", "nan", "inf")
_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^rank(\d+)$")
_PROC_RE = re.compile(r"^proc(\d+)$")


class Damage(str):
    """A reader warning that means data was lost (truncated, corrupt or missing parts).

    It is a plain ``str`` for everyone reading ``df.attrs["warnings"]``; :func:`damage` picks
    these out so that ``torchparity compare`` can refuse a damaged dump unless told to compare
    what was read (``--allow-partial``)."""


def damage(warnings: Iterable[str]) -> list[str]:
    """The warnings that report lost data."""
    return [w for w in warnings if isinstance(w, Damage)]


# ----------------------------------------------------------------------------------------------
# lazy tensor handles
# ----------------------------------------------------------------------------------------------


class TensorRef:
    """A lazy reference to one saved tensor. ``load()`` reads it; nothing is read before."""

    __slots__ = ("path", "key")

    def __init__(self, path: Path, key: str | None) -> None:
        self.path = path
        self.key = key

    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> Any:
        """Return the tensor (a ``torch.Tensor``). Raises :class:`DumpError` when unreadable."""
        if not self.path.is_file():
            raise DumpError(
                f"tensor file {self.path} is missing; the dump is incomplete (copied partially or "
                f"the process died) - re-run the dump, or compare in statistics mode"
            )
        try:
            return self._read()
        except DumpError:
            raise
        except Exception as exc:  # corrupt file, missing key, unsupported content
            raise DumpError(
                f"tensor '{self.key}' in {self.path} cannot be read ({type(exc).__name__}: {exc}); "
                f"the file is corrupt - re-run the dump, or compare in statistics mode"
            ) from None

    def _read(self) -> Any:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as f:
            return f.get_tensor(self.key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {self.key!r})"


class TensorLoader:
    """Loads many :class:`TensorRef` s, opening each safetensors file once (a small LRU of open
    files). Use as a context manager; ``load(ref)`` raises :class:`DumpError` like ``ref.load()``."""

    def __init__(self, max_open: int = 16) -> None:
        self.max_open = max_open
        self._open: dict[Path, Any] = {}

    def load(self, ref: TensorRef) -> Any:
        if type(ref) is not TensorRef:  # msprobe .pt files and other kinds: one file per tensor
            return ref.load()
        f = self._open.get(ref.path)
        if f is None:
            if not ref.path.is_file():
                return ref.load()  # the missing-file message
            try:
                from safetensors import safe_open

                f = safe_open(str(ref.path), framework="pt")
            except Exception:
                return ref.load()  # the corrupt-file message
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open)))
            self._open[ref.path] = f
        try:
            return f.get_tensor(ref.key)
        except Exception as exc:
            raise DumpError(
                f"tensor '{ref.key}' in {ref.path} cannot be read ({type(exc).__name__}: {exc}); "
                f"the file is corrupt - re-run the dump, or compare in statistics mode"
            ) from None

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "TensorLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PtRef(TensorRef):
    """An msprobe ``.pt`` tensor, read with ``torch.load(weights_only=True)`` (never unpickled)."""

    def _read(self) -> Any:
        import torch

        obj = torch.load(str(self.path), map_location="cpu", weights_only=True)
        if not isinstance(obj, torch.Tensor):
            raise DumpError(f"{self.path} does not hold a tensor but a {type(obj).__name__}")
        return obj


# ----------------------------------------------------------------------------------------------
# dump discovery
# ----------------------------------------------------------------------------------------------


@dataclass
class DumpUnit:
    """One (step, rank) directory of a dump."""

    step: int
    rank: int
    path: Path
    format: str  # torchparity | msprobe


@dataclass
class DumpReader:
    """An opened dump: which steps and ranks it holds, their headers, and their records."""

    path: Path
    format: str
    units: list[DumpUnit]
    warnings: list[str] = field(default_factory=list)
    _headers: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict, repr=False)

    # ---- structure --------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        return sorted({u.step for u in self.units})

    def ranks(self, step: int | None = None) -> list[int]:
        return sorted({u.rank for u in self.units if step is None or u.step == step})

    def unit(self, step: int, rank: int) -> DumpUnit:
        for u in self.units:
            if u.step == step and u.rank == rank:
                return u
        raise DumpError(
            f"{self.path} has no step {step} rank {rank}; it holds "
            + ", ".join(f"step{u.step}/rank{u.rank}" for u in self.units)
        )

    def select(self, step: int | None = None, rank: int | None = None) -> list[DumpUnit]:
        """The units for a step and/or rank filter; a filter that matches nothing is an error."""
        units = [u for u in self.units if (step is None or u.step == step) and (rank is None or u.rank == rank)]
        if not units:
            raise DumpError(
                f"{self.path} has no data for step={step} rank={rank}; available: "
                + ", ".join(f"step{u.step}/rank{u.rank}" for u in self.units)
            )
        return units

    # ---- metadata ---------------------------------------------------------------------------
    def header(self, step: int, rank: int) -> dict[str, Any]:
        """header.json of a rank directory (``{}`` when missing; msprobe: the dump.json task info)."""
        key = (step, rank)
        if key not in self._headers:
            u = self.unit(step, rank)
            if u.format == "msprobe":
                from .msprobe_reader import read_msprobe_header

                self._headers[key] = read_msprobe_header(u.path)
            else:
                self._headers[key] = _read_json_file(u.path / "header.json", []) or {}
        return self._headers[key]

    def footer(self, step: int, rank: int) -> dict[str, Any] | None:
        u = self.unit(step, rank)
        if u.format != "torchparity":
            return None
        return _read_json_file(u.path / "footer.json", [])

    def stacks(self, step: int, rank: int) -> dict[int, list[str]]:
        """Call stacks by id (``stacks.jsonl`` / msprobe ``stack.json``)."""
        u = self.unit(step, rank)
        if u.format == "msprobe":
            from .msprobe_reader import read_msprobe_stacks

            return read_msprobe_stacks(u.path)[0]
        out: dict[int, list[str]] = {}
        for obj in _iter_jsonl(u.path / "stacks.jsonl", []):
            try:
                out[int(obj["id"])] = list(obj.get("frames") or [])
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def modules(self, step: int, rank: int) -> list[dict[str, Any]]:
        """The module tree (``modules.jsonl``), first-seen order."""
        u = self.unit(step, rank)
        if u.format == "msprobe":
            return []
        return [m for m in _iter_jsonl(u.path / "modules.jsonl", []) if isinstance(m, dict)]

    # ---- records ----------------------------------------------------------------------------
    def frame(self, step: int | None = None, rank: int | None = None) -> Any:
        """All tensor entries of the selected units as one DataFrame (see :func:`load_dump`)."""
        import pandas as pd

        warnings: list[str] = list(self.warnings)
        frames = []
        for u in self.select(step, rank):
            frames.append(read_unit(u, warnings))
        frames = [f for f in frames if len(f)]
        df = pd.concat(frames, ignore_index=True) if frames else empty_frame()
        if len(frames) > 1:
            df = df[COLUMNS]
        df.attrs = {"path": str(self.path), "format": self.format, "warnings": warnings}
        return df


def _read_json_file(path: Path, warnings: list[str]) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        warnings.append(f"{path} is unreadable ({type(exc).__name__}: {exc}); ignored it")
        return None


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


def _num(name: str) -> int | None:
    m = re.match(r"^(?:step|rank|proc)(\d+)$", name)
    return int(m.group(1)) if m else None


def _is_tp_unit(p: Path) -> bool:
    return (p / "records.jsonl").is_file() or (p / "header.json").is_file() or (p / "footer.json").is_file()


def _is_ms_unit(p: Path) -> bool:
    return (p / "dump.json").is_file()


def _unit_dirs(step_dir: Path) -> list[Path]:
    return sorted(
        (d for d in step_dir.iterdir() if d.is_dir() and (_RANK_RE.match(d.name) or _PROC_RE.match(d.name))),
        key=lambda d: (d.name[:4], _num(d.name) or 0),
    )


def _units_of_step(step_dir: Path, step: int, warnings: list[str]) -> list[DumpUnit]:
    units: list[DumpUnit] = []
    dirs = _unit_dirs(step_dir)
    procs = [d for d in dirs if _PROC_RE.match(d.name)]
    if len(procs) > 1:
        warnings.append(
            f"{step_dir} holds {len(procs)} msprobe proc<PID> directories; numbered them as ranks "
            f"0..{len(procs) - 1} in PID order (msprobe wrote no rank numbers)"
        )
    proc_rank = {d: i for i, d in enumerate(procs)}
    for d in dirs:
        rank = proc_rank[d] if d in proc_rank else (_num(d.name) or 0)
        if _is_tp_unit(d):
            units.append(DumpUnit(step, rank, d, "torchparity"))
        elif _is_ms_unit(d):
            units.append(DumpUnit(step, rank, d, "msprobe"))
        else:
            warnings.append(f"{d} holds neither records.jsonl nor dump.json; skipped it (empty rank directory)")
    return units


def open_dump(path: str | Path) -> DumpReader:
    """Open a dump directory: the root, one ``stepN`` directory, or one rank directory.

    Also accepts an msprobe dump (root with ``stepN/rankN`` or ``stepN/procPID``, a step
    directory, a rank directory, or the ``dump.json`` file itself). Raises :class:`DumpError`
    when the path holds no dump.
    """
    p = Path(path)
    if not p.exists():
        raise DumpError(
            f"dump {p} does not exist; pass the directory written by `torchparity run -o DIR` / "
            f"torchparity.dump(DIR) (or an msprobe dump_path)"
        )
    warnings: list[str] = []
    if p.is_file():
        if p.name in ("dump.json", "records.jsonl", "header.json"):
            p = p.parent
        else:
            raise DumpError(f"{p} is a file, not a dump; pass the dump directory (or an msprobe dump.json)")
    units: list[DumpUnit] = []
    if _is_tp_unit(p) or _is_ms_unit(p):
        fmt = "torchparity" if _is_tp_unit(p) else "msprobe"
        rank = _num(p.name) if _RANK_RE.match(p.name) else 0
        step = _num(p.parent.name) if _STEP_RE.match(p.parent.name) else 0
        if fmt == "torchparity":
            hdr = _read_json_file(p / "header.json", warnings) or {}
            step = int(hdr.get("step", step or 0)) if isinstance(hdr, dict) else step
            rank = int(hdr.get("rank", rank or 0)) if isinstance(hdr, dict) else rank
        units.append(DumpUnit(step or 0, rank or 0, p, fmt))
    elif any(_unit_dirs_safe(p)):
        step = _num(p.name) if _STEP_RE.match(p.name) else 0
        units = _units_of_step(p, step or 0, warnings)
    else:
        step_dirs = sorted((d for d in p.iterdir() if d.is_dir() and _STEP_RE.match(d.name)), key=lambda d: _num(d.name) or 0)
        for sd in step_dirs:
            su = _units_of_step(sd, _num(sd.name) or 0, warnings)
            if not su:
                warnings.append(f"{sd} holds no rank directories; skipped it")
            units.extend(su)
    if not units:
        raise DumpError(
            f"no dump found in {p}: expected stepN/rankN/records.jsonl (torchparity) or "
            f"stepN/rankN|procPID/dump.json (msprobe) below it; check the path"
        )
    formats = {u.format for u in units}
    if len(formats) > 1:
        warnings.append(f"{p} mixes torchparity and msprobe rank directories; reading both")
    fmt = "torchparity" if "torchparity" in formats else "msprobe"
    if fmt == "torchparity":
        root_meta = _read_json_file(p / "torchparity.json", warnings)
        if isinstance(root_meta, dict) and int(root_meta.get("version", 1)) > 1:
            warnings.append(
                f"{p} was written by a newer torchparity (dump format version {root_meta.get('version')}); "
                f"this reader knows version 1 - upgrade torchparity if columns are missing"
            )
    return DumpReader(p, fmt, units, warnings)


def _unit_dirs_safe(p: Path) -> list[Path]:
    try:
        return _unit_dirs(p)
    except OSError:
        return []


# ----------------------------------------------------------------------------------------------
# torchparity records.jsonl -> rows
# ----------------------------------------------------------------------------------------------


def empty_frame() -> Any:
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})


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


def _scan_records(path: Path, rel: str, warnings: list[str], sink: Callable[[list[dict[str, Any]]], None]) -> int:
    """Parse records.jsonl chunk by chunk, handing each chunk of good records to ``sink`` (in
    file order); bad lines are skipped and reported in ``warnings``. Returns the records read."""
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
        if records is None:  # line by line: keep every good line, note the bad ones
            records = []
            for i, line in enumerate(chunk, start):
                if not line.strip():
                    continue
                try:
                    obj = loads(line)
                    if not isinstance(obj, dict) or "tensors" not in obj and "id" not in obj:
                        raise ValueError("not a record")
                    records.append(obj)
                except (ValueError, UnicodeDecodeError):
                    if i == n - 1 and not ends_with_newline:
                        truncated = True
                    else:
                        bad.append(i + 1)
        count += len(records)
        sink(records)
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


def _read_records(path: Path, rel: str, warnings: list[str]) -> list[dict[str, Any]]:
    """Parse records.jsonl, keeping every good line and reporting bad ones."""
    records: list[dict[str, Any]] = []
    _scan_records(path, rel, warnings, records.extend)
    return records


def read_unit(u: DumpUnit, warnings: list[str], compact: bool = False) -> Any:
    """Rows of one (step, rank) directory. ``compact``: a torchparity dump may be read into
    :data:`COMPARE_COLUMNS` only (what compare needs); an msprobe dump always has all columns."""
    if u.format == "msprobe":
        from .msprobe_reader import read_msprobe_unit

        return read_msprobe_unit(u, warnings)
    return read_torchparity_unit(u, warnings, compact)


def read_torchparity_unit(u: DumpUnit, warnings: list[str], compact: bool = False) -> Any:
    rel = f"step{u.step}/rank{u.rank}"
    rec_path = u.path / "records.jsonl"
    if not (u.path / "header.json").is_file():
        warnings.append(f"{rel}: header.json is missing; environment checks are skipped for this rank")
    elif _read_json_file(u.path / "header.json", warnings) is None:
        pass  # warning added
    if not rec_path.is_file():
        warnings.append(Damage(f"{rel}: records.jsonl is missing: the rank wrote no records (dump stopped before the first flush?)"))
        return empty_frame()
    if compact:  # flattened chunk by chunk while the parsed dicts are fresh in the CPU cache
        cols = _CompareColumns()
        n_records = _scan_records(rec_path, rel, warnings, cols.add)
    else:
        records = _read_records(rec_path, rel, warnings)
        n_records = len(records)
    footer = _read_json_file(u.path / "footer.json", warnings)
    if footer is None:
        warnings.append(Damage(
            f"{rel}: no footer.json, the dump was not closed cleanly (process killed or crashed); "
            f"read {n_records} records, anything after the last flush is lost"
        ))
    elif isinstance(footer, dict):
        expected = footer.get("records")
        if isinstance(expected, int) and expected != n_records:
            warnings.append(Damage(f"{rel}: footer.json says {expected} records but {n_records} were read; the file was altered or damaged"))
        if footer.get("budget_exhausted") or footer.get("dropped_tensors"):
            warnings.append(
                f"{rel}: the tensor budget was exhausted, {footer.get('dropped_tensors', '?')} tensors were "
                f"not saved (their rows have statistics only); raise the budget to save them"
            )
    if compact:
        return cols.frame(u.path)
    return records_to_frame(records, u.path, u.step, u.rank)


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def records_to_frame(records: list[dict[str, Any]], base: Path, step: int, rank: int) -> Any:
    """Flatten record dicts (the records.jsonl schema) into the reader's DataFrame."""
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    refs: dict[str, Path] = {}
    for r in records:
        tensors = r.get("tensors") or []
        if not isinstance(tensors, list):
            continue
        head = (
            r.get("id"), r.get("name"), r.get("op"), r.get("level"), r.get("phase"), r.get("module") or "",
            r.get("module_class"), r.get("call_index", 0), r.get("step", step), r.get("rank", rank),
            r.get("fwd"), r.get("stack"), r.get("flags"),
        )
        for t in tensors:
            if not isinstance(t, dict):
                continue
            st = t.get("stats") or {}
            f = t.get("file")
            ref = None
            if f:
                fp = refs.get(f)
                if fp is None:
                    fp = refs[f] = base / f
                ref = TensorRef(fp, t.get("key"))
            prod = t.get("producer")
            shape = t.get("shape")
            stride = t.get("stride")
            append(head + (
                t.get("io"), str(t.get("arg")), t.get("kind", "tensor"), t.get("dtype"),
                tuple(shape) if shape is not None else None, tuple(stride) if stride is not None else None,
                t.get("device"), t.get("requires_grad"), st.get("max"), st.get("min"), st.get("mean"),
                st.get("norm"), st.get("nan"), st.get("inf"), t.get("md5"), t.get("value"), f, t.get("key"),
                tuple(prod) if prod else None, ref,
            ))
    if not rows:
        return empty_frame()
    return _typed_frame(rows, COLUMNS)


def records_to_compare_frame(records: list[dict[str, Any]], base: Path, step: int, rank: int) -> Any:
    """Like :func:`records_to_frame`, with :data:`COMPARE_COLUMNS` only and built column by column:
    the same values, with text columns kept as ``object`` (see :class:`_CompareColumns`)."""
    cols = _CompareColumns()
    for i in range(0, len(records), CHUNK_LINES):
        cols.add(records[i:i + CHUNK_LINES])
    return cols.frame(base)


_STAT_VALUES = operator.itemgetter(*STAT_COLUMNS)
_NO_STATS = (None,) * len(STAT_COLUMNS)


def _stat_arrays(stats: list[tuple[Any, ...]]) -> dict[str, Any]:
    """float64 columns of the statistics tuples (in :data:`STAT_COLUMNS` order)."""
    import numpy as np

    try:
        a = np.array(stats, dtype="float64")
        if a.shape == (len(stats), len(STAT_COLUMNS)):
            return {c: a[:, k].copy() for k, c in enumerate(STAT_COLUMNS)}
    except (TypeError, ValueError, OverflowError):  # NaN/Infinity strings, odd values: per column
        pass
    return {c: _floats(list(v)) for c, v in zip(STAT_COLUMNS, zip(*stats))}


def _as_is(value: Any, default: Any) -> Any:
    """``dict.setdefault``'s signature, sharing nothing (for values that cannot be dict keys)."""
    return value


def _floats(values: list[Any]) -> Any:
    """float64 of JSON statistics: numbers, None (NaN) and the NaN/Infinity strings of writers
    that cannot write those literals; anything else is NaN."""
    import numpy as np

    try:
        return np.array(values, dtype="float64")
    except (TypeError, ValueError, OverflowError):  # other strings, lists, huge ints: one by one
        pass
    out = np.empty(len(values), dtype="float64")
    for i, v in enumerate(values):
        if isinstance(v, str):
            out[i] = _NONFINITE.get(v, math.nan)
        elif isinstance(v, (int, float)):
            try:
                out[i] = float(v)
            except OverflowError:
                out[i] = math.inf if v > 0 else -math.inf
        else:
            out[i] = math.nan
    return out


def _ints(values: list[Any]) -> Any:
    """int64 ids and counters (as ``pd.to_numeric``); anything that is not a number is -1."""
    import numpy as np

    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype="int64")
        except OverflowError:
            pass
    import pandas as pd

    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").fillna(-1).astype("int64").to_numpy()


def _objects(values: list[Any]) -> Any:
    """An object ndarray holding ``values`` as they are (tuples stay one element each)."""
    import numpy as np

    return np.fromiter(values, dtype=object, count=len(values))


class _CompareColumns:
    """Accumulates the compare frame (:data:`COMPARE_COLUMNS`) of record dicts, chunk by chunk.

    One pass over each chunk appends every field to its column list (no per-row tuple, no
    ``DataFrame.from_records`` type inference); record fields are read once per record and
    spread over its tensor rows at the end. Text columns are plain ``object`` columns: pandas
    >= 3 would otherwise infer its ``str`` dtype, whose comparisons and factorizations cost
    several times more in the compare.

    Equal values of the few-valued columns (op, level, phase, module, io, arg, kind, dtype,
    shape) share one object: every later comparison, ``isna`` or factorization of 200k rows then
    reads a handful of objects that stay in the CPU cache instead of one scattered object per
    row (about 10x faster each). Values are shared by equality, so JSON numbers of equal value
    share the first one seen (``1`` for a later ``1.0``) in the text columns, where the schema
    has strings, and in shapes; ``arg`` shares strings only (its non-strings become text)."""

    def __init__(self) -> None:
        self.heads: list[list[Any]] = [[] for _ in range(9)]
        self.cols: list[list[Any]] = [[] for _ in range(13)]
        self.n_records = 0
        self._shared: dict[Any, Any] = {}
        self._shapes: dict[Any, Any] = {}

    def add(self, records: list[dict[str, Any]]) -> None:
        lengths = [len(c) for c in self.heads + self.cols]
        try:
            self._add(records, self._shared.setdefault, self._shapes.setdefault)
        except TypeError:  # an unhashable value where a string or shape belongs: share nothing here
            for c, n in zip(self.heads + self.cols, lengths):
                del c[n:]
            self._add(records, _as_is, _as_is)
        self.n_records += len(records)

    def _add(self, records: list[dict[str, Any]], share: Callable[[Any, Any], Any],
             share_shape: Callable[[Any, Any], Any]) -> None:
        h_id, h_name, h_op, h_level, h_phase, h_module, h_ci, h_fwd, h_stack = (c.append for c in self.heads)
        (c_rec, c_io, c_arg, c_kind, c_dtype, c_shape, c_rg, c_stats, c_md5, c_value, c_prod, c_file,
         c_key) = (c.append for c in self.cols)
        stat_values = _STAT_VALUES
        for i, r in enumerate(records, self.n_records):
            g = r.get
            h_id(g("id")), h_name(g("name")), h_ci(g("call_index", 0)), h_fwd(g("fwd")), h_stack(g("stack"))
            v = g("op")
            h_op(share(v, v))
            v = g("level")
            h_level(share(v, v))
            v = g("phase")
            h_phase(share(v, v))
            v = g("module") or ""
            h_module(share(v, v))
            tensors = g("tensors")
            if type(tensors) is not list:
                continue
            for t in tensors:
                if type(t) is not dict:
                    continue
                g = t.get
                c_rec(i)
                v = g("io")
                c_io(share(v, v))
                v = g("arg")
                c_arg(share(v, v) if type(v) is str else v)
                v = g("kind", "tensor")
                c_kind(share(v, v))
                v = g("dtype")
                c_dtype(share(v, v))
                v = g("shape")
                if type(v) is list:
                    v = tuple(v)
                    v = share_shape(v, v)
                c_shape(v)
                c_rg(g("requires_grad"))
                st = g("stats")
                if type(st) is dict:
                    try:
                        c_stats(stat_values(st))
                    except KeyError:  # some statistics missing: None for them
                        c_stats(tuple(map(st.get, STAT_COLUMNS)))
                else:
                    c_stats(_NO_STATS)
                c_md5(g("md5")), c_value(g("value")), c_prod(g("producer")), c_file(g("file")), c_key(g("key"))

    def frame(self, base: Path) -> Any:
        """The DataFrame (tensor handles relative to the rank directory ``base``)."""
        import numpy as np
        import pandas as pd

        heads = self.heads
        rec, io, arg, kind, dtype, shape, rg, stats, md5, value, prod, files, keys = self.cols
        n = len(rec)
        if not n:
            return empty_frame()[COMPARE_COLUMNS]
        at = np.array(rec, dtype=np.intp)
        if not all(type(a) is str for a in arg):
            arg = [str(a) for a in arg]
        shape = [tuple(v) if type(v) is list else v for v in shape] if list in set(map(type, shape)) else shape
        prod = [tuple(v) if type(v) is list and v else None for v in prod]
        tensor: list[Any] = [None] * n
        if any(files):
            refs: dict[str, Path] = {}
            for j, f in enumerate(files):
                if f:
                    fp = refs.get(f)
                    if fp is None:
                        fp = refs[f] = base / f
                    tensor[j] = TensorRef(fp, keys[j])
        data = {
            "record_id": _ints(heads[0])[at], "name": _objects(heads[1])[at], "op": _objects(heads[2])[at],
            "level": _objects(heads[3])[at], "phase": _objects(heads[4])[at], "module": _objects(heads[5])[at],
            "call_index": _ints(heads[6])[at], "fwd": _objects(heads[7])[at], "stack": _objects(heads[8])[at],
            "io": _objects(io), "arg": _objects(arg), "kind": _objects(kind), "dtype": _objects(dtype),
            "shape": _objects(shape),
            "requires_grad": np.array(rg, dtype=bool) if all(type(v) is bool for v in rg) else _objects(rg),
            **_stat_arrays(stats), "md5": _objects(md5), "value": _objects(value),
            "producer": _objects(prod), "tensor": _objects(tensor),
        }
        return pd.DataFrame({c: pd.Series(data[c], dtype=data[c].dtype, copy=False) for c in COMPARE_COLUMNS},
                            copy=False)


def _typed_frame(rows: list[tuple[Any, ...]], columns: list[str]) -> Any:
    import numpy as np
    import pandas as pd

    df = pd.DataFrame.from_records(rows, columns=columns)
    for c in STAT_COLUMNS:
        col = df[c]
        if col.dtype == object:
            col = col.map(lambda v: _NONFINITE.get(v, np.nan) if isinstance(v, str) else v)
            df[c] = pd.to_numeric(col, errors="coerce")
        else:
            df[c] = col.astype("float64")
    for c in ("record_id", "call_index", "step", "rank"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce").fillna(-1).astype("int64")
    return df


def load_dump(path: str | Path, step: int | None = None, rank: int | None = None) -> Any:
    """Read a dump into a DataFrame with one row per tensor entry.

    Columns: ``record_id, name, op, level, phase, module, module_class, call_index, step, rank,
    fwd, stack, flags, io, arg, kind, dtype, shape, stride, device, requires_grad, max, min, mean,
    norm, nan, inf, md5, value, file, key, producer, tensor``. ``tensor`` is a lazy handle
    (``.load()`` returns the torch tensor) or None when the tensor was not saved.
    ``df.attrs``: ``path``, ``format`` (``torchparity`` or ``msprobe``) and ``warnings``.

    :param path: dump root, a ``stepN`` directory or a rank directory (torchparity or msprobe).
    :param step: only this step (default: all).
    :param rank: only this rank (default: all).
    :raises DumpError: the path holds no dump, or the step/rank filter matches nothing.
    """
    import gc

    reader = open_dump(path)
    was = gc.isenabled()
    gc.disable()  # millions of small long-lived containers: collections would dominate the time
    try:
        df = reader.frame(step, rank)
    finally:
        if was:
            gc.enable()
    for w in df.attrs["warnings"]:
        log.warning(w)
    return df
