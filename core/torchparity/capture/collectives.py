"""Which process group a collective ran on, and with which peer: the ``group`` / ``peer`` flags
of a ``Distributed.*`` record.

Collectives reach the aten level as ``c10d.*`` ops (a ``ProcessGroup`` argument named
``process_group``) or ``_c10d_functional.*`` ops (a ``group_name`` string). Their rank arguments
(``dst``, ``src``, ``root_rank``) are ranks *inside* the group; the dump writes global ranks. What
an op's schema says (which argument is the group, which is a peer) is worked out once per overload,
what a group is (its global ranks, name, DeviceMesh dimension) once per group: a collective costs
a dict look-up or two, and other ops nothing (only collectives call in here).

Also the unwrapping of distributed tensor subclasses (FSDP2's and tensor parallel's ``DTensor``)
to the shard this rank holds: :func:`local_value`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import Parameter  # noqa: F401 (the session's fast "not a subclass" test uses it)

#: schema argument names holding a rank inside the group -> (flag written, direction of a p2p op)
_PEER_ARGS = {"dst": ("peer", "send"), "src": ("peer", "recv"), "root_rank": ("root", None)}
#: ops whose ``src`` is a broadcast's root, not a point-to-point peer
_ROOTED_SRC = frozenset({"broadcast", "broadcast_"})
#: DeviceMesh names its groups ``mesh_<dim name>`` (``group_desc``, torch >= 2.4)
_MESH_PREFIX = "mesh_"


@dataclass(frozen=True)
class GroupInfo:
    """One process group, as a record's ``group`` flag describes it (``as_flag``)."""

    name: str  #: c10d's group name ("0" for the default group)
    ranks: tuple[int, ...]  #: global ranks, in group-rank order
    desc: str | None  #: c10d's description ("default_pg", "mesh_tp"), torch >= 2.4
    mesh_dim: str | None  #: the DeviceMesh dimension ("tp") when DeviceMesh made the group
    as_flag: dict[str, Any]  #: {"name", "ranks", "size"[, "mesh_dim"]}: shared, never mutated

    def global_rank(self, group_rank: int) -> int | None:
        """The global rank of ``group_rank`` in this group (None when out of range, e.g. -1)."""
        return self.ranks[group_rank] if 0 <= group_rank < len(self.ranks) else None


@dataclass(frozen=True)
class _Schema:
    """Where one collective overload keeps its group and rank arguments."""

    group_pos: int  #: position of ``process_group`` / ``group_name`` (-1: none)
    group_key: str
    ranks: tuple[tuple[int, str, str, str | None], ...]  #: (position, arg name, flag, direction)


class _EveryOutput(dict):
    """``no_values`` for every result of an op (the session asks ``arg in no_values`` and
    ``no_values.get(arg, ...)``)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __bool__(self) -> bool:  # empty, yet it holds every key
        return True

    def get(self, key: Any, default: Any = None) -> Any:
        return ASYNC_REASON


ASYNC_REASON = "asynchronous collective: written when its Work completes (its consumers record the result)"
#: the results of a collective op are not measured: a c10d op returns before the transfer is done
#: (gloo's worker thread, NCCL's stream), so its result read then is whatever the buffer held at
#: that instant. Its inputs (this rank's contribution) are measured; the ops reading the result
#: after ``wait()`` record it, re-measured (the op's written arguments are noted as written).
ASYNC_RESULTS: dict[str, str] = _EveryOutput()
#: collective-namespace ops whose result is final when they return
SYNC_COLLECTIVES = frozenset({"wait_tensor"})

_SCHEMAS: dict[int, _Schema] = {}
_GROUPS: dict[Any, GroupInfo] = {}  # id(ProcessGroup) or group name -> its info
_KEEP: list[Any] = []  # the ProcessGroups keyed by id() above, kept alive so that no id is reused


def _schema(func: Any) -> _Schema:
    s = _SCHEMAS.get(id(func))
    if s is not None:
        return s
    group_pos, group_key, ranks = -1, "", []
    schema = getattr(func, "_schema", None)
    base = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.name in ("process_group", "group_name", "group"):
            group_pos, group_key = i, a.name
        elif a.name in _PEER_ARGS:
            flag, direction = _PEER_ARGS[a.name]
            if a.name == "src" and base in _ROOTED_SRC:
                flag, direction = "root", None
            ranks.append((i, a.name, flag, direction))
    s = _SCHEMAS[id(func)] = _Schema(group_pos, group_key, tuple(ranks))
    return s


def _arg(args: tuple, kwargs: dict, pos: int, name: str) -> Any:
    return args[pos] if pos < len(args) else kwargs.get(name)


def _unbox(group: Any) -> Any:
    """The Python ProcessGroup of a c10d op's argument: a ``torch.ScriptObject`` box, new at
    every call, around the same group (``ProcessGroup.unbox``, ~1 us; the same Python object each
    time, so it keys the cache). None where this torch cannot unbox (then no group flag)."""
    if isinstance(group, torch.ScriptObject):
        import torch.distributed as dist

        unbox = getattr(dist.ProcessGroup, "unbox", None)
        return unbox(group) if unbox is not None else None
    return group


def _resolve(group: Any) -> Any:
    """The ProcessGroup object of a group name (functional collectives), or ``group`` itself."""
    if not isinstance(group, str):
        return group
    import torch.distributed.distributed_c10d as c10d

    resolve = getattr(c10d, "_resolve_process_group", None) or \
        getattr(torch._C._distributed_c10d, "_resolve_process_group", None)
    return resolve(group) if resolve is not None else None


def group_info(group: Any) -> GroupInfo | None:
    """What ``group`` (a ProcessGroup, or its name) is, cached per group; None when it cannot be
    told (torch.distributed not initialised, an unknown name)."""
    key = group if isinstance(group, str) else id(group)
    info = _GROUPS.get(key)
    if info is not None:
        return info
    try:
        import torch.distributed as dist

        pg = _resolve(group)
        if pg is None:
            return None
        ranks = tuple(dist.get_process_group_ranks(pg))
        name = getattr(pg, "group_name", None) or dist.distributed_c10d._world.pg_names.get(pg) or \
            (group if isinstance(group, str) else "")
        desc = getattr(pg, "group_desc", None) or None
    except Exception:  # a group torch.distributed does not know (destroyed, or a fake): no flag
        return None
    mesh_dim = desc[len(_MESH_PREFIX):] if desc and desc.startswith(_MESH_PREFIX) else None
    flag: dict[str, Any] = {"name": str(name), "ranks": list(ranks), "size": len(ranks)}
    if mesh_dim:
        flag["mesh_dim"] = mesh_dim
    info = GroupInfo(str(name), ranks, desc, mesh_dim, flag)
    _GROUPS[key] = info
    if not isinstance(group, str):
        _KEEP.append(group)
    return info


def collective_flags(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The flags a collective's record gets: ``group`` (name, global ranks, size, mesh_dim),
    and for point-to-point ops ``peer`` (the other side's global rank) and ``direction`` (send /
    recv), for rooted ones ``root`` (global rank). Empty when the op names no group. Never
    raises (recording a collective must not stop the user's job)."""
    try:
        s = _schema(func)
        if s.group_pos < 0:
            return {}
        group = _unbox(_arg(args, kwargs, s.group_pos, s.group_key))
        info = group_info(group) if group is not None else None
        if info is None:
            return {}
        flags: dict[str, Any] = {"group": info.as_flag}
        for pos, name, flag, direction in s.ranks:
            r = _arg(args, kwargs, pos, name)
            if isinstance(r, int):
                flags[flag] = info.global_rank(r)
                if direction is not None:
                    flags["direction"] = direction
        if "direction" not in flags and getattr(getattr(func, "overloadpacket", None), "__name__", "") \
                == "recv_any_source_":
            flags["direction"], flags["peer"] = "recv", None  # any source: the peer is not known before
        return flags
    except Exception:  # pragma: no cover - defensive: a schema torch changed
        return {}


def reset_groups() -> None:
    """Forget the groups seen (a new dump: the process may have re-initialised torch.distributed,
    and group names start again from "0")."""
    _GROUPS.clear()
    _KEEP.clear()


def known_groups() -> dict[str, GroupInfo]:
    """Every group this process has seen a collective on (name -> info): the dump header's
    ``world.groups`` adds them at the end."""
    return {i.name: i for i in _GROUPS.values()}


# ---- distributed tensors -----------------------------------------------------------------------
def is_dtensor(v: Any) -> bool:
    """A ``DTensor`` (FSDP2 parameters and gradients, tensor-parallel activations), by duck
    typing: importing torch.distributed.tensor just to ask is not free."""
    return v.__class__.__name__ == "DTensor" and hasattr(v, "_local_tensor")


def local_value(v: Any) -> Any:
    """The shard of ``v`` this rank holds, for a DTensor (measuring the DTensor itself would run
    collectives inside the tool, or fail for a partial placement); ``v`` otherwise."""
    if is_dtensor(v):
        return v._local_tensor
    return v
