"""The dump writer's encoding of op records to ``records.jsonl`` lines (its thread's hot path).

The lines are exactly what ``json.dumps(record.to_json())`` spells (orjson's compact form); they
are made with less work per tensor entry: a statistics dict the writer built from a row of finite
values is written as it is (``TensorEntry.to_json`` copies every statistics dict to encode
non-finite values as strings, two Python calls per entry for the integer NaN/Inf counts), and
orjson appends each line's newline itself (no ``str`` round trip). Records and entries of other
classes are encoded by their own ``to_json``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ..records import OpRecord, TensorEntry, encode_float

try:  # orjson encodes records ~5x faster than json.dumps; the writer thread then holds the GIL less
    from orjson import OPT_APPEND_NEWLINE
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - orjson is a dependency; stay usable without it
    _orjson_dumps = None
    OPT_APPEND_NEWLINE = 0


def stats_dict(row: list[float], ready: set[int]) -> dict[str, Any]:
    """The ``stats`` dict of a host row ``[max, min, mean, norm, nan, inf]``; its id joins
    ``ready`` when ``to_json`` would write it unchanged (max, min, mean and norm finite)."""
    st = {"max": row[0], "min": row[1], "mean": row[2], "norm": row[3], "nan": int(row[4]), "inf": int(row[5])}
    try:
        s = row[0] + row[1] + row[2] + row[3]  # finite only if all four are (an overflow: the general way)
        if s - s == 0:
            ready.add(id(st))
    except TypeError:  # a value that is not a number: the general way
        pass
    return st


def entry_dict(e: TensorEntry, ready: set[int]) -> dict[str, Any]:
    """``e.to_json()``, with a ``ready`` statistics dict taken as it is."""
    if e.__class__ is not TensorEntry:
        return e.to_json()
    if e.kind == "tensor":
        shape, stride = e.shape, e.stride
        d: dict[str, Any] = {"io": e.io, "arg": e.arg, "kind": "tensor", "dtype": e.dtype,
                             "shape": None if shape is None else list(shape),
                             "stride": None if stride is None else list(stride), "device": e.device,
                             "requires_grad": e.requires_grad}
        st = e.stats
        if st is not None:
            d["stats"] = st if id(st) in ready else {
                k: v if v.__class__ is float and v - v == 0 else encode_float(v) for k, v in st.items()}
        if e.md5 is not None:
            d["md5"] = e.md5
        if e.file is not None:
            d["file"], d["key"] = e.file, e.key
        if e.producer is not None:
            d["producer"] = e.producer
        return d
    return {"io": e.io, "arg": e.arg, "kind": e.kind, "value": e.value}


def record_dict(r: OpRecord, ready: set[int]) -> dict[str, Any]:
    """``r.to_json()`` (see :func:`entry_dict`)."""
    if r.__class__ is not OpRecord:
        return r.to_json()
    d: dict[str, Any] = {
        "id": r.id, "name": r.name, "op": r.op, "level": r.level, "phase": r.phase, "module": r.module,
        "module_class": r.module_class, "call_index": r.call_index, "step": r.step, "rank": r.rank, "fwd": r.fwd,
        "stack": r.stack, "tensors": [entry_dict(e, ready) for e in r.tensors],
    }
    if r.flags:
        d["flags"] = r.flags
    return d


def encode_lines(records: Iterable[OpRecord], ready: set[int] = frozenset()) -> bytes:  # type: ignore[assignment]
    """The ``records.jsonl`` lines of ``records`` (UTF-8, one JSON object and a newline each)."""
    if _orjson_dumps is not None:
        return b"".join([_orjson_dumps(record_dict(r, ready), option=OPT_APPEND_NEWLINE) for r in records])
    return "".join(json.dumps(record_dict(r, ready), allow_nan=False) + "\n" for r in records).encode()


_STEP_MARK = 8457294058347  # stand-ins, split out of a record's encoded line (each must occur once)
_STATS_MARK = "\x01torchparity-stats\x01"


class LineTemplates:
    """The ``records.jsonl`` lines of records that repeat step after step but for their step and
    their one tensor entry's statistics (a compiled graph's records: the same nodes, names, shapes
    and flags every step), encoded once. :meth:`encode` then writes a step's lines from its
    statistics rows alone: the same bytes :func:`encode_lines` writes for those records, for a
    fraction of the Python work (no dict per record and entry, one ``orjson.dumps`` per row).

    :raises ValueError: a record that does not fit (not one entry; orjson missing): the caller
        writes record objects instead."""

    __slots__ = ("parts", "n")

    def __init__(self, records: list[OpRecord]) -> None:
        if _orjson_dumps is None:
            raise ValueError("orjson is not importable")
        step_b = b'"step":%d' % _STEP_MARK
        stats_b = _orjson_dumps(_STATS_MARK)
        parts = []
        for r in records:
            e = r.tensors[0] if len(r.tensors) == 1 else None
            # one plain tensor entry awaiting its statistics (the keys encode_lines writes after
            # "stats", and the stats-less form of other entries, would not be spelled alike)
            if r.__class__ is not OpRecord or e is None or e.__class__ is not TensorEntry or e.kind != "tensor" \
                    or e.stats is not None or e.md5 is not None or e.file is not None or e.producer is not None:
                raise ValueError("a record without exactly one plain tensor entry awaiting statistics")
            d = record_dict(r, set())
            d["step"] = _STEP_MARK
            d["tensors"][0]["stats"] = _STATS_MARK
            line = _orjson_dumps(d, option=OPT_APPEND_NEWLINE)
            if line.count(step_b) != 1 or line.count(stats_b) != 1:
                raise ValueError("a record's line holds a stand-in value")
            head, rest = line.split(step_b)
            mid, tail = rest.split(stats_b)
            if line.index(step_b) > line.index(stats_b) or not mid.endswith(b',"stats":'):
                raise ValueError("an unexpected key order")
            parts.append((head + b'"step":', mid, tail))
        self.parts = parts
        self.n = len(parts)

    def encode(self, step: int, rows: list[Any]) -> bytes:
        """The lines of step ``step`` whose entries' statistics rows are ``rows`` (one per record,
        ``[max, min, mean, norm, nan, inf]``, or None for no statistics)."""
        if len(rows) != self.n:
            raise ValueError(f"{len(rows)} statistics rows for {self.n} records")
        s = b"%d" % step
        dumps = _orjson_dumps
        out = []
        add = out.append
        no_stats = len(b',"stats":')
        for (head, mid, tail), row in zip(self.parts, rows):
            if row is None:
                add(head + s + mid[:-no_stats] + tail)
                continue
            st = {"max": row[0], "min": row[1], "mean": row[2], "norm": row[3], "nan": int(row[4]),
                  "inf": int(row[5])}
            f = row[0] + row[1] + row[2] + row[3]
            if not f - f == 0:  # a non-finite statistic: written as a string (encode_float)
                st = {k: v if v.__class__ is float and v - v == 0 else encode_float(v) for k, v in st.items()}
            add(head + s + mid + dumps(st) + tail)
        return b"".join(out)
