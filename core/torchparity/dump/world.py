"""The job's world layout in each rank's ``header.json`` (key ``world``).

Written when the dump starts (under torchrun a dump may start before ``init_process_group``: then
the environment's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` are all that is known) and completed
when it stops: the backend, and the process groups created or first used in between (a
DeviceMesh made after the dump started), are then written into every ``header.json`` of this
rank. See docs/dump-format.md ("world") and docs/distributed.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from ..capture.collectives import group_info, known_groups, reset_groups
from ..capture.ranks import current_rank, world_size

log = logging.getLogger("torchparity")


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _groups() -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """(group name -> {ranks, size[, desc, mesh_dim]}, DeviceMesh dim -> size) of the groups this
    process belongs to, plus those it ran a collective on."""
    groups: dict[str, dict[str, Any]] = {}
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            me = current_rank()
            for pg in list(dist.distributed_c10d._world.pg_group_ranks):
                info = group_info(pg)
                if info is not None and info.name and me in info.ranks:  # not the groups of other ranks
                    groups[info.name] = _describe(info)
    except Exception:  # an internal torch moved: the groups used by collectives still count
        pass
    me = current_rank()
    for name, info in known_groups().items():
        if name and me in info.ranks:  # group_info() above also cached the groups of other ranks
            groups.setdefault(name, _describe(info))
    mesh = {g["mesh_dim"]: g["size"] for g in groups.values() if g.get("mesh_dim")}
    return dict(sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))), mesh


def _describe(info: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"ranks": list(info.ranks), "size": len(info.ranks)}
    if info.desc:
        d["desc"] = info.desc
    if info.mesh_dim:
        d["mesh_dim"] = info.mesh_dim
    return d


def world_layout() -> dict[str, Any]:
    """The job's layout as this rank sees it now (the ``world`` entry of ``header.json``)."""
    backend = None
    initialized = False
    try:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if initialized:
            backend = str(dist.get_backend())
    except Exception:
        pass
    groups, mesh = _groups()
    world: dict[str, Any] = {
        "world_size": world_size(), "rank": current_rank(),
        "local_rank": _env_int("LOCAL_RANK"), "local_world_size": _env_int("LOCAL_WORLD_SIZE"),
        "node": socket.gethostname(), "node_rank": _env_int("GROUP_RANK") if _env_int("GROUP_RANK") is not None
        else _env_int("SLURM_NODEID"),
        "initialized": initialized, "backend": backend, "groups": groups,
    }
    if mesh:
        world["mesh_dims"] = mesh
    return world


def start_layout() -> dict[str, Any]:
    """The layout at the dump's start (forgets the groups a previous dump saw: torch.distributed
    may have been initialised again since, and group names start again from "0")."""
    reset_groups()
    return world_layout()


def complete_headers(root: str | os.PathLike[str], rank: int, started: dict[str, Any]) -> int:
    """At the dump's end: write the layout as it is now into every ``header.json`` of ``rank``
    under ``root`` when it changed since ``started`` (groups made later, the backend of a process
    group initialised after the dump started). Returns how many headers were rewritten; a header
    that cannot be rewritten keeps the layout of the start (never an error: the dump is done)."""
    now = world_layout()
    if now == started:
        return 0
    from .writer import _atomic_write_json

    done = 0
    for step_dir in Path(root).iterdir() if Path(root).is_dir() else ():
        if not re.fullmatch(r"step\d+", step_dir.name):
            continue
        path = step_dir / f"rank{rank}" / "header.json"
        try:
            header = json.loads(path.read_text(encoding="utf-8"))
            header["world"] = now
            if now.get("initialized"):  # written before init_process_group: the rank is known now
                header["world_size"] = now["world_size"]
            _atomic_write_json(path, header)
            done += 1
        except (OSError, ValueError):
            continue
    return done
