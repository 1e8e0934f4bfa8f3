"""What an op is, from PyTorch's own op metadata rather than hand-written lists.

Used by the dump (flags), online compare (what can be re-run) and the NaN/Inf tracker.
"""

from __future__ import annotations

from typing import Any

import torch

COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor"})
#: ops whose result is uninitialised memory or pure metadata: never judged numerically
UNINITIALISED_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"})
#: ops whose *indices* depend on ties: compare values only
TIE_SENSITIVE_OPS = frozenset({"sort", "topk", "argmax", "argmin", "argsort", "max", "min", "kthvalue", "mode", "median", "nanmedian", "unique", "_unique2", "unique_consecutive", "msort", "cummax", "cummin"})


def namespace(func: Any) -> str:
    return getattr(func, "namespace", "") or ""


def base_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(func, "__name__", str(func))


def is_collective(func: Any) -> bool:
    return namespace(func) in COLLECTIVE_NAMESPACES


def is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False))


def is_random(func: Any) -> bool:
    tags = getattr(func, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def is_inplace(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return bool(schema.is_mutable)
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name.startswith("__i")


def written_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, is a tensor list) of the arguments the op writes into, from its schema's
    alias info. Single-tensor writes get their version counter bumped by autograd's
    ADInplaceOrView kernel after the op returns; tensor-list writes (``_foreach_*_``) do not."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    out = []
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is not None and info.is_write:
            out.append((i, a.name, isinstance(a.type, torch.ListType)))
    return tuple(out)


def is_uninitialised(func: Any) -> bool:
    return base_name(func) in UNINITIALISED_OPS


def is_tie_sensitive(func: Any) -> bool:
    return base_name(func) in TIE_SENSITIVE_OPS
