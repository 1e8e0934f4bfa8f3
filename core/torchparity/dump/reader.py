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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DumpError
from .columns import (  # noqa: F401 - re-exported: the reader's public names
    COLUMNS, COMPARE_COLUMNS, RECORD_COLUMNS, STAT_COLUMNS, TENSOR_COLUMNS, RecordColumns, empty_frame,
)
from .footer import kind_of as _kind, one_line as _one_line, read_footer  # noqa: F401
from .damage import Damage, damage  # noqa: F401 - re-exported
from .header_check import checked_header
from .tensors import PtRef, TensorLoader, TensorRef  # noqa: F401 - re-exported
from .units import DumpUnit  # noqa: F401 - re-exported
from .jsonl_scan import CHUNK_LINES, _iter_jsonl, _scan_records  # noqa: F401 - re-exported

log = logging.getLogger("torchparity")

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^rank(\d+)$")
_PROC_RE = re.compile(r"^proc(\d+)$")




# ----------------------------------------------------------------------------------------------
# dump discovery
# ----------------------------------------------------------------------------------------------


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

    def lost_units(self) -> list[tuple[int, int, int]]:
        """``(step, rank, named_by)`` for each step directory a rank wrote but the dump no longer
        holds: a later step's header names it as the step written before it (``prev_step``;
        dumps from before that field name none)."""
        have = {(u.step, u.rank) for u in self.units}
        lost = []
        for u in self.units:
            if u.format != "torchparity":
                continue
            prev = self.header(u.step, u.rank).get("prev_step")
            if type(prev) is int and 0 <= prev < u.step and (prev, u.rank) not in have:
                lost.append((prev, u.rank, u.step))
        return sorted(set(lost))

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
                hdr = _read_json_file(u.path / "header.json", [])
                self._headers[key] = checked_header(hdr)[0] if isinstance(hdr, dict) else {}
        return self._headers[key]

    def footer(self, step: int, rank: int) -> dict[str, Any] | None:
        """footer.json of a rank directory; None when missing or damaged (:func:`footer_problems`
        says which)."""
        u = self.unit(step, rank)
        if u.format != "torchparity":
            return None
        footer = _read_json_file(u.path / "footer.json", [])
        return footer if isinstance(footer, dict) else None

    def stacks(self, step: int, rank: int, warnings: list[str] | None = None) -> dict[int, list[str]]:
        """Call stacks by id (``stacks.jsonl`` / msprobe ``stack.json``). Damaged lines of
        ``stacks.jsonl`` (not JSON, not an object with an integer ``id``) are left out (the ops that
        point at them show no call stack) and counted in one line in ``warnings``."""
        u = self.unit(step, rank)
        if u.format == "msprobe":
            from .msprobe_reader import read_msprobe_stacks

            return read_msprobe_stacks(u.path)[0]
        out: dict[int, list[str]] = {}
        path = u.path / "stacks.jsonl"
        if not path.is_file():
            return out
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            if warnings is not None:
                warnings.append(f"cannot read {path} ({exc.strerror or exc}); "
                                f"the ops show no call stack")
            return out
        bad: list[int] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not isinstance(obj, dict) or type(obj.get("id")) is not int:
                bad.append(n)
                continue
            frames = obj.get("frames")
            out[obj["id"]] = [str(f) for f in frames] if isinstance(frames, list) else []
        if bad and warnings is not None:
            warnings.append(f"{path}: {len(bad)} damaged line(s) left out (line "
                            f"{bad[0]}: not an object with an integer id); the ops that point at them show no "
                            f"call stack (the numbers are unaffected)")
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
        warnings += [Damage(lost_line(s, r, by)) for s, r, by in self.lost_units()
                     if (step is None or s == step) and (rank is None or r == rank)]
        frames = [f for f in frames if len(f)]
        df = pd.concat(frames, ignore_index=True) if frames else empty_frame()
        if len(frames) > 1:
            df = df[COLUMNS]
        df.attrs = {"path": str(self.path), "format": self.format, "warnings": warnings}
        return df


def lost_reason(rank: int, named_by: int) -> str:
    """Why a step directory counts as lost (:meth:`DumpReader.lost_units`), in every message."""
    return f"step{named_by}/rank{rank}'s header says the run wrote it (deleted, moved or not copied?)"


def lost_line(step: int, rank: int, named_by: int, side: str | None = None) -> str:
    """A lost step directory, told as a reader warning (``side``: which of two dumps)."""
    where = f" from the {side} dump" if side else ""
    return f"step{step}/rank{rank} is missing{where}: {lost_reason(rank, named_by)}"


def _read_json_file(path: Path, warnings: list[str], what: str | None = None) -> Any:
    """The JSON value in ``path``; None (and a warning naming ``what``, default the path) when
    the file is missing or unreadable."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        why = str(exc).splitlines()[0] if str(exc) else ""
        warnings.append(f"{what or path} is unreadable ({type(exc).__name__}: {why:.120}); ignored it")
        return None


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
    if not p.is_dir():
        if p.name == "dump.json" and p.is_file() and not _is_tp_unit(p.parent):
            p = p.parent  # an msprobe dump.json: its rank directory
        else:
            raise DumpError(f"{p} is a file, not a dump; pass the dump directory"
                            + (f" ({p.parent.parent.parent} or {p.parent})" if p.name in _DUMP_FILES else "")
                            + " (or an msprobe dump.json)")
    units: list[DumpUnit] = []
    if _is_tp_unit(p) or _is_ms_unit(p):
        fmt = "torchparity" if _is_tp_unit(p) else "msprobe"
        rank = _num(p.name) if _RANK_RE.match(p.name) else 0
        step = _num(p.parent.name) if _STEP_RE.match(p.parent.name) else 0
        if fmt == "torchparity":
            hdr = _read_json_file(p / "header.json", [])
            if isinstance(hdr, dict):
                step = hdr["step"] if _nonneg_int(hdr.get("step")) else step
                rank = hdr["rank"] if _nonneg_int(hdr.get("rank")) else rank
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
        warnings.extend(_root_meta_problems(p / "torchparity.json"))
    return DumpReader(p, fmt, units, warnings)


_DUMP_FILES = ("records.jsonl", "header.json", "footer.json", "stacks.jsonl", "modules.jsonl")


def _nonneg_int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _root_meta_problems(path: Path) -> list[str]:
    """Warnings about the dump root's ``torchparity.json`` (format name and version)."""
    out: list[str] = []
    meta = _read_json_file(path, out, what=str(path))
    if meta is None:
        return out
    if not isinstance(meta, dict):
        return [f"{path} holds {_kind(meta)}, not an object; it is damaged - read the dump as format version 1"]
    version = meta.get("version", 1)
    if type(version) is not int:
        out.append(f"{path}: 'version' is {_kind(version)} ({version!r:.40}), not an integer; the file is "
                   f"damaged - read the dump as format version 1")
    elif version > 1:
        out.append(f"{path.parent} was written by a newer torchparity (dump format version {version}); "
                   f"this reader knows version 1 - upgrade torchparity if columns are missing")
    return out


def _unit_dirs_safe(p: Path) -> list[Path]:
    try:
        return _unit_dirs(p)
    except OSError:
        return []


# ----------------------------------------------------------------------------------------------
# torchparity records.jsonl -> rows
# ----------------------------------------------------------------------------------------------


def read_unit(u: DumpUnit, warnings: list[str], compact: bool = False) -> Any:
    """Rows of one (step, rank) directory. ``compact``: a torchparity dump may be read into
    :data:`COMPARE_COLUMNS` only (what compare needs); an msprobe dump always has all columns."""
    if u.format == "msprobe":
        from .msprobe_reader import read_msprobe_unit

        return read_msprobe_unit(u, warnings)
    return read_torchparity_unit(u, warnings, compact)


def read_torchparity_unit(u: DumpUnit, warnings: list[str], compact: bool = False) -> Any:
    """Rows of one torchparity rank directory; every problem found goes to ``warnings``."""
    rel = f"step{u.step}/rank{u.rank}"
    rec_path = u.path / "records.jsonl"
    if not (u.path / "header.json").is_file():
        warnings.append(f"{rel}: header.json is missing; environment checks are skipped for this rank")
    else:
        header = _read_json_file(u.path / "header.json", warnings, what=f"{rel}/header.json")
        if header is not None and not isinstance(header, dict):
            warnings.append(f"{rel}/header.json holds {type(header).__name__}, not an object; ignored it "
                            f"(environment checks are skipped for this rank)")
        elif isinstance(header, dict):
            bad = checked_header(header)[1]
            if bad:
                warnings.append(f"{rel}/header.json: {', '.join(bad)} (wrong type); ignored those fields "
                                f"(metadata only: the records are read as usual)")
    if not rec_path.is_file():
        warnings.append(Damage(f"{rel}: records.jsonl is missing: the rank wrote no records (dump stopped before the first flush?)"))
        return empty_frame()
    if compact:  # the compare's columns from the Parquet summaries when present (dump/columnar.py)
        from .columnar import read_compare_frame

        df = read_compare_frame(u, warnings)
        if df is not None:
            return df
    # flattened chunk by chunk while the parsed dicts are fresh in the CPU cache
    cols = RecordColumns(full=not compact, step=u.step, rank=u.rank)
    n_records = _scan_records(rec_path, rel, warnings, cols.add)
    warnings.extend(footer_problems(u.path, rel, n_records))
    return cols.frame(u.path, warnings, f"{rel}/records.jsonl")


def footer_problems(rank_dir: Path, rel: str, n_records: int) -> list[str]:
    """What ``footer.json`` says about a rank directory whose records.jsonl held ``n_records``
    records (see :func:`torchparity.dump.footer.read_footer`); lost data is :class:`Damage`."""
    return read_footer(rank_dir, rel, n_records).problems


def records_to_frame(records: list[dict[str, Any]], base: Path, step: int, rank: int,
                     warnings: list[str] | None = None) -> Any:
    """Flatten record dicts (the records.jsonl schema) into the reader's full DataFrame; records
    with wrong values are left out and reported in ``warnings``."""
    cols = RecordColumns(full=True, step=step, rank=rank)
    for i in range(0, len(records), CHUNK_LINES):
        cols.add(records[i:i + CHUNK_LINES])
    return cols.frame(base, warnings)


def records_to_compare_frame(records: list[dict[str, Any]], base: Path, step: int, rank: int,
                             warnings: list[str] | None = None) -> Any:
    """Like :func:`records_to_frame`, with :data:`COMPARE_COLUMNS` only."""
    cols = RecordColumns()
    for i in range(0, len(records), CHUNK_LINES):
        cols.add(records[i:i + CHUNK_LINES])
    return cols.frame(base, warnings)


def load_dump(path: str | Path, step: int | None = None, rank: int | None = None, *, log_warnings: bool = True) -> Any:
    """Read a dump into a DataFrame with one row per tensor entry.

    Columns: ``record_id, name, op, level, phase, module, module_class, call_index, step, rank,
    fwd, stack, flags, io, arg, kind, dtype, shape, stride, device, requires_grad, max, min, mean,
    norm, nan, inf, md5, value, file, key, producer, tensor``. ``tensor`` is a lazy handle
    (``.load()`` returns the torch tensor) or None when the tensor was not saved.
    ``df.attrs``: ``path``, ``format`` (``torchparity`` or ``msprobe``) and ``warnings``.

    :param path: dump root, a ``stepN`` directory or a rank directory (torchparity or msprobe).
    :param step: only this step (default: all).
    :param rank: only this rank (default: all).
    :param log_warnings: also log each reader warning (a caller that reports them itself: False).
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
    for w in df.attrs["warnings"] if log_warnings else ():
        log.warning(w)
    return df
