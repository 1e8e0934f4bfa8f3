"""Types of the ``header.json`` fields the readers use (a damaged or hand-edited header must not
reach the compare, ``info`` or the replay judge as a traceback).

A field of the wrong type is dropped from the header the reader hands on, and named in one
warning: header fields are metadata (environment checks, the tier, the compiled capture's
description), never numbers that are compared, so the dump stays readable without them.
"""

from __future__ import annotations

from typing import Any

from .footer import kind_of as _kind

#: field -> the JSON types it may have (``None``: null allowed)
HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "format": (str,), "version": (int,), "tool_version": (str, type(None)), "level": (str,), "mode": (str,),
    "checksum": (str, type(None)), "world_size": (int,), "backend": (dict,), "config": (dict,),
    "world": (dict, type(None)), "schedule": (dict, type(None)), "compile": (dict,), "tier": (str, type(None)),
    "step": (int,), "rank": (int,), "prev_step": (int, type(None)),
}
#: fields inside ``backend`` that are read (compare's environment checks, the replay judge)
BACKEND_TYPES: dict[str, tuple[type, ...]] = {"numerics": (dict,), "torch_version": (str,), "name": (str,)}


def _ok(v: Any, types: tuple[type, ...]) -> bool:
    if type(v) is bool:  # JSON true/false is not an integer here
        return bool in types
    return isinstance(v, types)


def checked_header(header: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``header`` less its fields of the wrong type, and one problem line per dropped field."""
    out = dict(header)
    problems: list[str] = []
    for k, types in HEADER_TYPES.items():
        if k in out and not _ok(out[k], types):
            problems.append(f"'{k}' is {_kind(out.pop(k))}")
    backend = out.get("backend")
    if isinstance(backend, dict):
        backend = dict(backend)
        for k, types in BACKEND_TYPES.items():
            if k in backend and not _ok(backend[k], types):
                problems.append(f"'backend.{k}' is {_kind(backend.pop(k))}")
        out["backend"] = backend
    return out, problems
