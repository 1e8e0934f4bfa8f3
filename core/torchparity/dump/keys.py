"""Damaged key names: a key one edit away from a key the object lacks (``call_ixdex`` for
``call_index``, ``data_naMe`` for ``data_name``). Its value would be silently lost (a default read
in its place), so the readers report it as damage. A key with a name of its own, as a newer
writer might add, is read past."""

from __future__ import annotations

from typing import Any, Iterable

#: the keys torchparity's writers put in a record of records.jsonl, and in one of its tensor entries
RECORD_KEYS = frozenset({"id", "name", "op", "level", "phase", "module", "module_class", "call_index", "step", "rank",
                         "fwd", "stack", "tensors", "flags"})
ENTRY_KEYS = frozenset({"io", "arg", "kind", "dtype", "shape", "stride", "device", "requires_grad", "stats", "md5",
                        "file", "key", "producer", "value"})


def one_edit(a: str, b: str) -> bool:
    """``a`` is ``b`` with its letter case changed, or with one character replaced, added or removed."""
    if a.lower() == b.lower():
        return True
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    if abs(len(a) - len(b)) != 1:
        return False
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k, (x, y) in enumerate(zip(short, long_)) if x != y), len(short))
    return short[i:] == long_[i + 1:]


def damaged_key(obj: dict[str, Any], known: Iterable[str]) -> tuple[str, str] | None:
    """(key found, key it stands for) of the first key of ``obj`` one edit away from a known key
    ``obj`` lacks; None when there is none."""
    known = tuple(known)
    for k in obj:
        if type(k) is not str or k in known:
            continue
        near = next((x for x in known if x not in obj and one_edit(k, x)), None)
        if near is not None:
            return k, near
    return None
