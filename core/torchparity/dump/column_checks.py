"""What a records.jsonl value may be: the reader's value rules, and the column scans that find
the records breaking them.

:class:`~torchparity.dump.columns.RecordColumns` collects a dump's records column by column; the
scans here check those columns whole (``docs/dump-format.md``, "What the reader checks"), mostly
on their *distinct* values and value types, so a clean dump pays a few C-level passes per column.
Each scan yields (index, problem) for a value of the wrong type or out of its range; the caller
drops the record and reports it as :class:`~torchparity.dump.reader.Damage`.
"""

from __future__ import annotations

import math
import re
from itertools import chain
from pathlib import PurePosixPath
from typing import Any, Callable, Iterable, Sequence

from ..records import LEVELS


IO_VALUES = frozenset({"input", "output", "param", "grad"})
KIND_VALUES = frozenset({"tensor", "scalar", "none"})
#: record levels our writers write (capture: module, api, aten; "mix" is a dump level, accepted too)
LEVEL_VALUES = frozenset(LEVELS)
#: an op name as the writers write it: an aten overload (``aten.gelu.default``), an API
#: (``torch.nn.functional.linear``, ``Tensor.__add__``), a module class (``Linear``), a custom op
#: (``mylib::op``); never spaces, control characters or punctuation such as ``?``
_OP_RE = re.compile(r"^[^\W\d][\w.:<>-]*$")
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_NONE = type(None)
_NUMBER = (int, float)


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


# ---- column scans -----------------------------------------------------------------------------


def record_problems(rc: Any) -> Iterable[tuple[int, str]]:  # rc: a columns.RecordColumns
    """(record index, problem) of the record-level columns of ``rc`` (id, name, op ...)."""
    ids, names, ops, levels, phases, modules, cis, fwds, stacks, _cd = rc.heads
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
    if rc.full:
        cls, steps, ranks, flags = rc.xheads
        yield from _column_problems(cls, (str, _NONE), None, "module_class")
        yield from _column_problems(steps, (int,), _nonneg_int, "step")
        yield from _column_problems(ranks, (int,), _nonneg_int, "rank")
        yield from _column_problems(flags, (dict, _NONE), None, "flags", distinct=False)


def row_problems(rc: Any, stat_names: Sequence[str]) -> Iterable[tuple[int, str]]:  # rc: a columns.RecordColumns
    """(row index, problem) of the tensor-entry columns of ``rc``; ``stat_names``: the statistics
    in the order of ``rc``'s statistics tuples."""
    import numpy as np

    rec, io, arg, kind, dtype, shape, stride, rg, stats, md5, value, prod, files, keys = rc.cols
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
    if rc.full:
        yield from _column_problems(rc.device, (str, _NONE), None, "device")
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
        ids = rc.heads[0]
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
            for c, v in zip(stat_names, st):
                if not (type(v) in _NUMBER or (type(v) is str and v in NONFINITE)):
                    yield i, f"stats.{c} is {_type_name(v)} ({_shown(v)}), not a number"
                    break
