"""records.jsonl records -> the reader's DataFrame, column by column, every value checked.

:class:`RecordColumns` accumulates parsed record dicts chunk by chunk (one pass per chunk, no
per-row tuple, no ``DataFrame.from_records`` type inference) and builds either the compare frame
(:data:`COMPARE_COLUMNS`) or the full frame (:data:`COLUMNS`).

Validation (``docs/dump-format.md``, "What the reader checks") is done on whole columns, mostly on
their *distinct* values and value types, so a clean dump pays a few C-level passes per column: a
record with a value of the wrong type or out of its range (``"max": "oops"``, a tensor entry that
is a string, a negative or non-integer ``shape`` or ``stride``, an unknown ``kind``, an ``"op"``
that is a list ...) is dropped whole and reported as :class:`~torchparity.dump.reader.Damage`
naming the file, the line and what is wrong. Nothing the reader could not read is ever handed to
the compare as if it had been read. The value rules and the column scans that apply them are
:mod:`~torchparity.dump.column_checks`; this module collects the columns and builds the frame.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import Any, Callable, Sequence

from .column_checks import NONFINITE, _shown, _type_name, record_problems, row_problems
from .column_checks import dtype_ok  # noqa: F401 - re-exported: its home before column_checks
from .keys import ENTRY_KEYS, RECORD_KEYS, damaged_key
from .tensors import TensorRef

RECORD_COLUMNS = [
    "record_id", "name", "op", "level", "phase", "module", "module_class", "call_index", "step",
    "rank", "fwd", "stack", "flags",
]
TENSOR_COLUMNS = [
    "io", "arg", "kind", "dtype", "shape", "stride", "device", "requires_grad", "max", "min",
    "mean", "norm", "nan", "inf", "md5", "value", "file", "key", "producer",
]
COLUMNS = RECORD_COLUMNS + TENSOR_COLUMNS + ["tensor"]
#: a torchparity dump's frames also have ``compute_dtype``: a module record's
#: ``flags["compute_dtype"]`` (the precision its subtree computed in: bf16 parameters, fp16
#: autocast), None elsewhere and in older dumps (an msprobe frame has no such column)
TP_COLUMNS = COLUMNS + ["compute_dtype"]
#: the columns ``torchparity.compare`` reads (``read_unit(..., compact=True)``): building only
#: these makes reading a big statistics dump ~25 % faster
COMPARE_COLUMNS = [
    "record_id", "name", "op", "level", "phase", "module", "call_index", "fwd", "stack", "io", "arg", "kind",
    "dtype", "shape", "requires_grad", "max", "min", "mean", "norm", "nan", "inf", "md5", "value", "producer",
    "tensor", "compute_dtype",
]
STAT_COLUMNS = ("max", "min", "mean", "norm", "nan", "inf")

_STAT_VALUES = operator.itemgetter(*STAT_COLUMNS)
_NO_STATS = (math.nan,) * len(STAT_COLUMNS)  # an entry without statistics
#: problems shown in the one-line damage message (the count covers them all)
SHOWN_PROBLEMS = 3


def empty_frame() -> Any:
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype="object") for c in TP_COLUMNS})


def _as_is(value: Any, default: Any) -> Any:
    """``dict.setdefault``'s signature, sharing nothing (for values that cannot be dict keys)."""
    return value


def _floats(values: Sequence[Any]) -> Any:
    """float64 of JSON statistics: numbers, None (NaN) and the NaN/Infinity strings of writers
    that cannot write those literals; anything else is NaN (and reported by the validation)."""
    import numpy as np

    try:
        return np.array(values, dtype="float64")
    except (TypeError, ValueError, OverflowError):  # other strings, lists, huge ints: one by one
        pass
    out = np.empty(len(values), dtype="float64")
    for i, v in enumerate(values):
        if isinstance(v, str):
            out[i] = NONFINITE.get(v, math.nan)
        elif isinstance(v, (int, float)):
            try:
                out[i] = float(v)
            except OverflowError:
                out[i] = math.inf if v > 0 else -math.inf
        else:
            out[i] = math.nan
    return out


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


def _ints(values: Sequence[Any]) -> Any:
    """int64 ids and counters; anything that is not an integer is -1 (and reported)."""
    import numpy as np

    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype="int64")
        except OverflowError:
            pass
    return np.array([v if type(v) is int and -2**63 <= v < 2**63 else -1 for v in values], dtype="int64")


def _objects(values: Sequence[Any]) -> Any:
    """An object ndarray holding ``values`` as they are (tuples stay one element each)."""
    import numpy as np

    return np.fromiter(values, dtype=object, count=len(values))


class RecordColumns:
    """Accumulates the reader's frame of record dicts, chunk by chunk (see the module docstring).

    Equal values of the few-valued columns (op, level, phase, module, io, arg, kind, dtype,
    shape, stride) share one object: every later comparison, ``isna`` or factorization of 200k
    rows then reads a handful of objects that stay in the CPU cache instead of one scattered
    object per row (about 10x faster each), and the validation reads each distinct value once.
    Values are shared by equality, so JSON numbers of equal value share the first one seen
    (``1`` for a later ``1.0``) in shapes; ``arg`` shares strings only. Text columns are plain
    ``object`` columns: pandas >= 3 would otherwise infer its ``str`` dtype, whose comparisons
    and factorizations cost several times more in the compare.

    :param full: also collect ``module_class, step, rank, flags, device`` (:data:`COLUMNS`).
    :param step, rank: defaults of a full frame's ``step`` / ``rank`` columns.
    """

    def __init__(self, full: bool = False, step: int = 0, rank: int = 0) -> None:
        self.full = full
        self.step, self.rank = step, rank
        self.heads: list[list[Any]] = [[] for _ in range(10)]  # ..., stack, compute_dtype
        self.xheads: list[list[Any]] = [[] for _ in range(4)]  # full: module_class, step, rank, flags
        self.cols: list[list[Any]] = [[] for _ in range(14)]
        self.device: list[Any] = []
        self.n_records = 0
        self.lines: list[Sequence[int]] = []  # 1-based line numbers of the records, chunk by chunk
        self.bad: dict[int, str] = {}  # record index -> first problem found while collecting
        self._shared: dict[Any, Any] = {}
        self._shapes: dict[Any, Any] = {}

    def add(self, records: list[dict[str, Any]], lines: Sequence[int] | None = None) -> None:
        """Add parsed records (``lines``: their 1-based line numbers in records.jsonl)."""
        every = self.heads + self.xheads + self.cols + [self.device]
        lengths = [len(c) for c in every]
        n_bad = len(self.bad)
        try:
            self._add(records, self._shared.setdefault, self._shapes.setdefault)
        except TypeError:  # an unhashable value where a string or shape belongs: share nothing here
            for c, n in zip(every, lengths):
                del c[n:]
            for k in list(self.bad)[n_bad:]:
                del self.bad[k]
            self._add(records, _as_is, _as_is)
        self.lines.append(lines if lines is not None else range(self.n_records + 1, self.n_records + len(records) + 1))
        self.n_records += len(records)

    def _add(self, records: list[dict[str, Any]], share: Callable[[Any, Any], Any],
             share_shape: Callable[[Any, Any], Any]) -> None:
        h_id, h_name, h_op, h_level, h_phase, h_module, h_ci, h_fwd, h_stack, h_cd = (c.append for c in self.heads)
        x_cls, x_step, x_rank, x_flags = (c.append for c in self.xheads)
        (c_rec, c_io, c_arg, c_kind, c_dtype, c_shape, c_stride, c_rg, c_stats, c_md5, c_value, c_prod,
         c_file, c_key) = (c.append for c in self.cols)
        c_device = self.device.append
        rows = self.cols[0]
        full, step, rank, bad = self.full, self.step, self.rank, self.bad
        record_keys, entry_keys = RECORD_KEYS, ENTRY_KEYS
        stat_values = _STAT_VALUES
        for i, r in enumerate(records, self.n_records):
            g = r.get
            if not record_keys.issuperset(r):  # a key no writer writes: a damaged name of a known one?
                hit = damaged_key(r, RECORD_KEYS)
                if hit is not None:
                    bad.setdefault(i, f"has a key {_shown(hit[0])} where {hit[1]!r} belongs (a damaged key)")
            h_id(g("id")), h_name(g("name")), h_ci(g("call_index", 0)), h_fwd(g("fwd")), h_stack(g("stack"))
            v = g("op")
            h_op(share(v, v))
            v = g("level")
            h_level(share(v, v))
            v = g("phase")
            h_phase(share(v, v))
            v = g("module")
            h_module(share(v, v) if v is not None else "")
            v = g("flags")
            v = v.get("compute_dtype") if type(v) is dict else None
            h_cd(share(v, v) if type(v) is str else None)
            if full:
                v = g("module_class")
                x_cls(share(v, v)), x_step(g("step", step)), x_rank(g("rank", rank)), x_flags(g("flags"))
            tensors = g("tensors")
            if type(tensors) is not list:
                if tensors is not None:
                    bad.setdefault(i, f"tensors is {_type_name(tensors)}, not a list")
                continue
            for k, t in enumerate(tensors):
                if type(t) is not dict:
                    bad.setdefault(i, f"tensors[{k}] is {_type_name(t)} ({_shown(t)}), not an object")
                    continue
                if not entry_keys.issuperset(t):
                    hit = damaged_key(t, ENTRY_KEYS)
                    if hit is not None:
                        bad.setdefault(i, f"tensors[{k}] has a key {_shown(hit[0])} where {hit[1]!r} belongs "
                                          f"(a damaged key)")
                g = t.get
                c_rec(i)
                v = g("io")
                c_io(share(v, v))
                v = g("arg")
                c_arg(share(v, v) if type(v) is str else v)
                kv = g("kind", "tensor")
                c_kind(share(kv, kv))
                v = g("dtype")
                if v is None and kv == "tensor":
                    bad.setdefault(i, f"tensors[{k}] is a tensor without dtype")
                c_dtype(share(v, v))
                v = g("shape")
                if type(v) is list:
                    v = tuple(v)
                    v = share_shape(v, v)
                elif v is None and kv == "tensor":
                    bad.setdefault(i, f"tensors[{k}] is a tensor without shape")
                c_shape(v)
                v = g("stride")
                if type(v) is list:
                    v = tuple(v)
                    v = share_shape(v, v)
                c_stride(v)
                c_rg(g("requires_grad"))
                st = g("stats")
                if type(st) is dict:
                    try:
                        c_stats(stat_values(st))
                    except KeyError:  # a statistic missing: the entry is damaged
                        c_stats(tuple(map(st.get, STAT_COLUMNS)))
                        bad.setdefault(i, f"tensors[{k}].stats lacks "
                                       + ", ".join(c for c in STAT_COLUMNS if c not in st))
                else:
                    c_stats(_NO_STATS)
                    if st is not None or "stats" in t:
                        bad.setdefault(i, f"tensors[{k}].stats is {_type_name(st)} ({_shown(st)}), not an object")
                c_md5(g("md5")), c_value(g("value")), c_prod(g("producer")), c_file(g("file")), c_key(g("key"))
                if full:
                    v = g("device")
                    c_device(share(v, v))
        del rows

    # ---- validation ---------------------------------------------------------------------------

    def _line(self, record: int) -> int:
        for seq in self.lines:
            if record < len(seq):
                return seq[record]
            record -= len(seq)
        return -1

    def problems(self) -> dict[int, str]:
        """record index -> the first problem found in it (empty for a clean dump)."""
        bad = dict(self.bad)
        for i, why in record_problems(self):
            bad.setdefault(i, why)
        rec = self.cols[0]
        for j, why in row_problems(self, STAT_COLUMNS):
            bad.setdefault(rec[j], f"tensors entry {j - _first_row(rec, j)}: {why}")
        return bad

    def damage_message(self, bad: dict[int, str], file: str) -> str:
        """The one-line report of the records dropped for wrong values."""
        shown = "; ".join(f"line {self._line(i)}: {why}" for i, why in sorted(bad.items())[:SHOWN_PROBLEMS])
        more = " ..." if len(bad) > SHOWN_PROBLEMS else ""
        return (f"{file}: {len(bad)} record(s) with wrong values skipped ({shown}{more}); read "
                f"{self.n_records - len(bad)} records - the file was altered or damaged after writing; "
                f"re-run the dump, or compare the rest with --allow-partial")

    # ---- the frame ----------------------------------------------------------------------------

    def frame(self, base: Path, damage: list[str] | None = None, file: str = "records.jsonl") -> Any:
        """The DataFrame (tensor handles relative to the rank directory ``base``). Records with
        wrong values are left out and reported in ``damage`` (a one-line message)."""
        import numpy as np
        import pandas as pd

        from .damage import Damage

        columns = TP_COLUMNS if self.full else COMPARE_COLUMNS
        bad = self.problems()
        if bad and damage is not None:
            damage.append(Damage(self.damage_message(bad, file)))
        heads, xheads = self.heads, self.xheads
        rec, io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys = self.cols
        n = len(rec)
        if not n:
            return empty_frame()[columns]
        at = np.array(rec, dtype=np.intp)
        keep = None
        if bad:
            keep = ~np.isin(at, np.fromiter(bad, dtype=np.intp, count=len(bad)))
            if not keep.any():
                return empty_frame()[columns]
            at = at[keep]
        if not all(type(a) is str for a in arg):
            arg = [str(a) for a in arg]
        prod = [tuple(v) if type(v) is list and v else None for v in prod]
        tensor: list[Any] = [None] * n
        if any(files):
            refs: dict[str, Path] = {}
            for j, f in enumerate(files):
                if f and type(f) is str:
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
            "producer": _objects(prod), "tensor": _objects(tensor), "compute_dtype": _objects(heads[9])[at],
        }
        if self.full:
            data.update({
                "module_class": _objects(xheads[0])[at], "step": _ints(xheads[1])[at], "rank": _ints(xheads[2])[at],
                "flags": _objects(xheads[3])[at], "stride": _objects(stride), "device": _objects(self.device),
                "file": _objects(files), "key": _objects(keys),
            })
        if keep is not None:
            for c in data:
                if len(data[c]) == n:
                    data[c] = data[c][keep]
        df = pd.DataFrame({c: pd.Series(data[c], dtype=data[c].dtype, copy=False) for c in columns}, copy=False)
        if self.full:  # ids: numbers (NaN where absent), as DataFrame.from_records gave them
            for c in ("fwd", "stack"):
                df[c] = pd.to_numeric(df[c])
        return df


def _first_row(rec: list[int], j: int) -> int:
    """The first row of the record that row ``j`` belongs to (rows of a record are contiguous)."""
    r = rec[j]
    while j > 0 and rec[j - 1] == r:
        j -= 1
    return j
