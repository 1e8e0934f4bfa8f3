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
the compare as if it had been read.
"""

from __future__ import annotations

import math
import operator
import re
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Sequence

from ..records import LEVELS
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
IO_VALUES = frozenset({"input", "output", "param", "grad"})
KIND_VALUES = frozenset({"tensor", "scalar", "none"})
#: record levels our writers write (capture: module, api, aten; "mix" is a dump level, accepted too)
LEVEL_VALUES = frozenset(LEVELS)
#: an op name as the writers write it: an aten overload (``aten.gelu.default``), an API
#: (``torch.nn.functional.linear``, ``Tensor.__add__``), a module class (``Linear``), a custom op
#: (``mylib::op``); never spaces, control characters or punctuation such as ``?``
_OP_RE = re.compile(r"^[^\W\d][\w.:<>-]*$")
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_STAT_VALUES = operator.itemgetter(*STAT_COLUMNS)
_NO_STATS = (math.nan,) * len(STAT_COLUMNS)  # an entry without statistics
_NONE = type(None)
_NUMBER = (int, float)
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


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", tuple: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", _NONE: "null"}.get(type(v), type(v).__name__)


def _shown(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


# ---- value rules ------------------------------------------------------------------------------


_NEWER_DTYPES = re.compile(r"^(float8_\w+|float4_\w+|u?int\d+|bits\w+)$")


def dtype_ok(name: str) -> bool:
    """A torch dtype name (``float16`` or ``torch.float16``). Names of dtypes newer than this torch
    (float8/float4 variants, uint/int widths, bits) are accepted by their form."""
    import torch

    base = name[6:] if name.startswith("torch.") else name
    return isinstance(getattr(torch, base, None), torch.dtype) or _NEWER_DTYPES.match(base) is not None


def _nonneg_int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _int_tuple(v: Any, nonneg: bool) -> bool:
    return type(v) is tuple and all(type(x) is int and (x >= 0 or not nonneg) for x in v)


def _safe_file(v: Any) -> bool:
    if v is None:
        return True
    if type(v) is not str or not v or "\x00" in v or "\\" in v:
        return False
    p = PurePosixPath(v)
    return not p.is_absolute() and ".." not in p.parts


def _aten_name_form(op: str, phase: str) -> tuple[tuple[str, ...], str] | None:
    """What every torchparity writer names an aten-level record of ``op`` in ``phase``:
    ``Aten.<op>.<k>.<phase>`` (``Distributed.`` for a collective), as (name prefixes, suffix); the
    middle is the counter ``k`` (for an op outside ``aten``, ``<name>.<k>``). None when ``op`` is not
    ``namespace.name.overload`` of identifiers (``str(OpOverload)``): no name agrees with it."""
    parts = op.split(".")
    if len(parts) < 3 or not all(x.isidentifier() for x in parts):
        return None
    base = f"{parts[1]}." if parts[0] == "aten" else ""
    return (f"Aten.{base}", f"Distributed.{base}"), f".{phase}"


def _column_problems(values: Sequence[Any], types: tuple[type, ...], ok: Callable[[Any], bool] | None,
                     what: str, distinct: bool = True) -> Iterable[tuple[int, str]]:
    """(index, problem) of the values of a column whose type is not one of ``types`` or which
    ``ok`` refuses. A clean column costs one C-level pass: over its distinct values (``distinct``,
    for columns of few values, mostly shared objects) or over its value types (columns of many
    different values: ids, names, checksums; ``ok`` is then not used)."""
    allowed = set(types)
    if distinct:
        try:
            seen: set[Any] | None = set(values)
        except TypeError:  # a list or an object where a string or shape belongs
            seen = None
        # the types of every value, not of the distinct ones: ``True == 1`` and ``(True,) == (1,)``,
        # so a set keeps whichever came first and a boolean id hid behind an integer one
        if seen is not None and all(type(v) in allowed and (ok is None or ok(v)) for v in seen) \
                and set(map(type, values)) <= allowed:
            return
    elif set(map(type, values)) <= allowed:
        return
    expected = " or ".join(_type_name(t()) if t is not _NONE else "null" for t in types)
    for i, v in enumerate(values):
        if type(v) not in allowed:
            yield i, f"{what} is {_type_name(v)} ({_shown(v)}), not {expected}"
        elif ok is not None and not ok(v):
            yield i, f"{what} has a bad value {_shown(v)}"


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

    def _record_problems(self) -> Iterable[tuple[int, str]]:
        ids, names, ops, levels, phases, modules, cis, fwds, stacks, _cd = self.heads
        if set(map(type, ids)) - {int} or min(ids, default=0) < 0:
            yield from _column_problems(ids, (int,), _nonneg_int, "id")
        yield from _column_problems(names, (str,), None, "name", distinct=False)
        if "" in names:  # one C-level scan: an empty name identifies nothing
            yield from ((i, "name is empty") for i, v in enumerate(names) if v == "")
        yield from _column_problems(ops, (str,), lambda v: _OP_RE.match(v) is not None, "op")
        yield from _column_problems(levels, (str,), LEVEL_VALUES.__contains__, "level")
        yield from _column_problems(phases, (str,), bool, "phase")
        if "aten" in levels:  # an aten record's name spells its op and phase: Aten.<op>.<k>.<phase>
            seen: dict[tuple[str, str], tuple[tuple[str, ...], str] | None] = {}
            for i, (nm, op, lv, ph) in enumerate(zip(names, ops, levels, phases)):
                if lv != "aten" or type(nm) is not str or type(op) is not str or type(ph) is not str:
                    continue
                key = (op, ph)
                form = seen[key] if key in seen else seen.setdefault(key, _aten_name_form(op, ph))
                if form is not None and nm.endswith(form[1]) and nm.startswith(form[0]):  # inline: a hot loop
                    heads, tail = form
                    head = heads[0] if nm.startswith(heads[0]) else heads[1]
                    base, _, k = nm[len(head):len(nm) - len(tail)].rpartition(".")
                    # aten ops: the middle is the counter; other namespaces: <name>.<counter>
                    if k.isdigit() and (bool(base) if head in ("Aten.", "Distributed.") else not base):
                        continue
                yield i, (f"name {_shown(nm)} and op {_shown(op)} do not agree (an aten record is "
                          f"Aten.<op>.<k>.<phase> of op namespace.<op>.overload, phase {_shown(ph)})")
        yield from _column_problems(modules, (str,), None, "module")
        yield from _column_problems(cis, (int,), _nonneg_int, "call_index")
        yield from _column_problems(fwds, (int, _NONE), None, "fwd", distinct=False)
        yield from _column_problems(stacks, (int, _NONE), None, "stack")
        if self.full:
            cls, steps, ranks, flags = self.xheads
            yield from _column_problems(cls, (str, _NONE), None, "module_class")
            yield from _column_problems(steps, (int,), _nonneg_int, "step")
            yield from _column_problems(ranks, (int,), _nonneg_int, "rank")
            yield from _column_problems(flags, (dict, _NONE), None, "flags", distinct=False)

    def _row_problems(self) -> Iterable[tuple[int, str]]:
        import numpy as np

        rec, io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys = self.cols
        yield from _column_problems(io, (str,), IO_VALUES.__contains__, "io")
        yield from _column_problems(arg, (str,), None, "arg")
        yield from _column_problems(kind, (str,), KIND_VALUES.__contains__, "kind")
        yield from _column_problems(dtype, (str, _NONE), lambda v: v is None or dtype_ok(v), "dtype")
        yield from _column_problems(shape, (tuple, _NONE), lambda v: v is None or _int_tuple(v, True), "shape")
        yield from _column_problems(stride, (tuple, _NONE), lambda v: v is None or _int_tuple(v, False), "stride")
        yield from _column_problems(rg, (bool, _NONE), None, "requires_grad")
        yield from _column_problems(md5, (str, _NONE), None, "md5", distinct=False)
        yield from _column_problems(files, (str, _NONE), _safe_file, "file")
        yield from _column_problems(keys, (str, _NONE), None, "key", distinct=False)
        if files.count(None) != keys.count(None):  # the writer sets both or neither
            for i, (f, k) in enumerate(zip(files, keys)):
                if (f is None) != (k is None):
                    yield i, f"a tensor entry has {'a file but no key' if k is None else 'a key but no file'}"
        if self.full:
            yield from _column_problems(self.device, (str, _NONE), None, "device")
        # producer: [record id, output index]
        types = set(map(type, prod))
        given = [p for p in prod if p is not None] if types - {_NONE} else []
        if given and not (types <= {list, _NONE} and set(map(len, given)) <= {0, 2}
                          and set(map(type, chain.from_iterable(given))) <= {int}
                          and min(chain.from_iterable(given), default=0) >= 0):
            for i, p in enumerate(prod):
                if p is not None and not (type(p) is list and len(p) in (0, 2)
                                          and all(type(x) is int and x >= 0 for x in p)):
                    yield i, f"producer is {_shown(p)}, not [record id, output index]"
        if given:  # a link names an earlier record of this rank and step, and one of its outputs
            ids = self.heads[0]
            present = set(ids)  # a record whose line was lost is not here: links to it are not judged
            n_out: dict[Any, int] = {}
            for r_i, o in zip(rec, io):
                if o == "output":
                    n_out[ids[r_i]] = n_out.get(ids[r_i], 0) + 1
            for i, (r_i, p) in enumerate(zip(rec, prod)):
                if type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is int and p[1] >= 0 \
                        and type(ids[r_i]) is int \
                        and (p[0] >= ids[r_i] or (p[0] in present and n_out.get(p[0], 0) <= p[1])):
                    yield i, (f"producer {_shown(p)} names no output of an earlier record (record {p[0]} "
                              f"{'is not earlier' if p[0] >= ids[r_i] else f'has {n_out.get(p[0], 0)} output(s)'})")
        # statistics: numbers, or the strings NaN / Infinity / -Infinity
        types = set(map(type, chain.from_iterable(stats)))
        strings = {v for v in chain.from_iterable(stats) if type(v) is str} if str in types else set()
        if types - {int, float, str} or strings - NONFINITE.keys():
            for i, st in enumerate(stats):
                for c, v in zip(STAT_COLUMNS, st):
                    if not (type(v) in _NUMBER or (type(v) is str and v in NONFINITE)):
                        yield i, f"stats.{c} is {_type_name(v)} ({_shown(v)}), not a number"
                        break

    def _line(self, record: int) -> int:
        for seq in self.lines:
            if record < len(seq):
                return seq[record]
            record -= len(seq)
        return -1

    def problems(self) -> dict[int, str]:
        """record index -> the first problem found in it (empty for a clean dump)."""
        bad = dict(self.bad)
        for i, why in self._record_problems():
            bad.setdefault(i, why)
        rec = self.cols[0]
        for j, why in self._row_problems():
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
