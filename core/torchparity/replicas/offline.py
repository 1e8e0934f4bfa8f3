"""``torchparity replicas DIR``: check data-parallel replicas offline, from a dump of any mode.

What is compared across the ranks of each step, strongest evidence first:

1. the replica hashes of ``torchparity.dump(..., replica_check=True)`` (``DIR/replicas/``): each
   parameter's gradient after the all-reduce and each parameter after the optimizer step,
   bitwise;
2. otherwise the dump's own records: module-level parameter entries (``io == "param"``: the
   parameters a module's forward used, i.e. after the previous step's update) and every tensor
   of the optimizer phase (api/aten levels: the optimizer's ops read the all-reduced gradients
   and the parameters and write the updated parameters). Each is compared bitwise where the dump
   allows: the saved tensor (tensor mode), its md5 (md5 mode), else its six statistics (equal to
   the last bit; statistics mode).

Module-level ``parameters_grad`` records are not compared: they are taken when autograd
accumulates a rank's own gradient, before DDP's all-reduce, so replicas legitimately differ.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import DumpError, UsageError
from .hashing import ALGORITHM
from .recorder import SUBDIR
from .vote import ReplicaFinding, vote

log = logging.getLogger("torchparity")
#: order of kinds inside one step: the forward's parameters come first, the update's result last
_KIND_ORDER = {"param_in": 0, "grad": 1, "optimizer": 2, "param": 3}
_SOURCE_TEXT = {"hash": "replica hashes (dump option replica_check)", "tensor": "saved tensors, bitwise",
                "md5": "md5 of each tensor", "stats": "statistics, to the last bit"}
NOTHING_TO_CHECK = ("holds nothing to check replicas with: dump with replica_check=True "
                    "(torchparity.dump(..., replica_check=True)), or at level module (parameters) or "
                    "api/aten (optimizer ops)")


@dataclass
class ReplicaReport:
    """The outcome of an offline replica check."""

    path: str
    source: str  # hash | tensor | md5 | stats (several, comma-separated, when they mix)
    steps: list[int]
    ranks: list[int]
    compared: int  # (step, quantity) pairs compared across at least two ranks
    findings: list[ReplicaFinding] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what could not be compared, one line each
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> ReplicaFinding | None:
        return self.findings[0] if self.findings else None

    @property
    def exit_code(self) -> int:
        """1 replicas disagree; 2 something was not compared (and nothing disagrees); 0 agree."""
        if self.findings:
            return 1
        return 2 if self.missing else 0

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "steps": self.steps, "ranks": self.ranks,
                "compared": self.compared, "agree": not self.findings and not self.missing,
                "first": self.first.to_json() if self.first else None,
                "findings": [f.to_json() for f in self.findings], "missing": self.missing, "notes": self.notes}


# ---- reading -----------------------------------------------------------------------------------

Values = dict[tuple[int, str, str], dict[int, Any]]  # (step, kind, name) -> {rank: value}


def _hash_lines(path: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    rel = f"{SUBDIR}/{path.name}"
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                obj = json.loads(raw)
            except ValueError:
                notes.append(f"{rel} line {n} is damaged (a killed process?); skipped it")
                continue
            if not (isinstance(obj, dict) and isinstance(obj.get("step"), int) and isinstance(obj.get("names"), list)):
                notes.append(f"{rel} line {n} is not a replica-hash line; skipped it")
                continue
            if obj.get("algorithm") != ALGORITHM:
                raise DumpError(f"{path}: hashes of algorithm {obj.get('algorithm')!r}, this torchparity reads "
                                f"{ALGORITHM!r}; check them with the torchparity version that wrote them")
            yield obj


def _from_hashes(root: Path, notes: list[str]) -> tuple[Values, dict[int, int | None], dict[int, set[int]]]:
    """Values, each rank's world size, and the steps each rank wrote."""
    values: Values = {}
    world: dict[int, int | None] = {}
    steps: dict[int, set[int]] = {}
    for f in sorted((root / SUBDIR).glob("rank*.jsonl")):
        try:
            rank = int(f.stem[4:])
        except ValueError:
            continue
        world.setdefault(rank, None)
        steps.setdefault(rank, set())
        for obj in _hash_lines(f, notes):
            step = obj["step"]
            steps[rank].add(step)
            if isinstance(obj.get("world_size"), int):
                world[rank] = obj["world_size"]
            prefix = f"optimizer{obj['optimizer']}." if obj.get("optimizer") else ""
            for kind in ("grad", "param"):
                hashes = obj.get(kind) or []
                for name, h in zip(obj["names"], hashes):
                    values.setdefault((step, kind, prefix + str(name)), {})[rank] = h
    return values, world, steps


def _value(row: Any, loader: Any) -> tuple[str, Any]:
    """(source, value) of one tensor entry: the saved tensor's hash, its md5, or its statistics."""
    ref = row.get("tensor")
    if ref is not None:
        try:
            from .hashing import hex64, tensor_hash

            return "tensor", hex64(int(tensor_hash(loader.load(ref))))
        except Exception:  # a tensor file lost or damaged: fall back to what the record holds
            pass
    md5 = row.get("md5")
    if isinstance(md5, str) and md5:
        return "md5", md5
    stats = []
    for k in ("max", "min", "mean", "norm", "nan", "inf"):
        v = row.get(k)
        stats.append("nan" if isinstance(v, float) and math.isnan(v) else (float(v).hex() if v is not None else None))
    return "stats", stats


def _from_records(root: Path, notes: list[str], sources: set[str]) -> tuple[Values, dict[int, int | None], dict[int, set[int]]]:
    from ..dump.reader import TensorLoader, open_dump

    reader = open_dump(root)
    values: Values = {}
    world: dict[int, int | None] = {}
    steps: dict[int, set[int]] = {}
    grads_seen = False
    with TensorLoader() as loader:
        for u in reader.units:
            ws = reader.header(u.step, u.rank).get("world_size")
            if isinstance(ws, int):
                if world.get(u.rank) not in (None, ws):
                    raise UsageError(f"{root}: rank {u.rank} says world size {world[u.rank]} in one step and {ws} "
                                     f"in step {u.step}; were two jobs dumped into one directory?")
                world[u.rank] = ws
            else:
                world.setdefault(u.rank, None)
            steps.setdefault(u.rank, set()).add(u.step)
            df = reader.frame(u.step, u.rank)
            notes.extend(str(w) for w in df.attrs.get("warnings", []))
            if not len(df):
                continue
            grads_seen = grads_seen or bool((df["io"] == "grad").any())
            tensors = df[df["kind"] == "tensor"]
            params = tensors[tensors["io"] == "param"]
            seen: set[str] = set()
            for row in params.to_dict("records"):
                mod = row.get("module") or ""
                name = f"{mod}.{row['arg']}" if mod else str(row["arg"])
                if name in seen:  # a module called twice in a step: its parameters are the same tensors
                    continue
                seen.add(name)
                src, v = _value(row, loader)
                sources.add(src)
                values.setdefault((u.step, "param_in", name), {})[u.rank] = v
            # collectives are left out: their inputs (and a gather's or reduce-scatter's outputs)
            # legitimately differ between ranks
            opt = tensors[(tensors["phase"] == "optimizer") & (tensors["io"] != "grad")
                          & ~tensors["name"].astype(str).str.startswith("Distributed.")]
            for row in opt.to_dict("records"):
                name = f"{row['name']} {row['io']} {row['arg']}"
                src, v = _value(row, loader)
                sources.add(src)
                values.setdefault((u.step, "optimizer", name), {})[u.rank] = v
    if grads_seen:
        notes.append("parameters_grad records were not compared: they hold each rank's own gradient before the "
                     "all-reduce (dump with replica_check=True to check gradients after it)")
    return values, world, steps


# ---- checking ----------------------------------------------------------------------------------


def check_replicas(path: str | Path) -> ReplicaReport:
    """Check the data-parallel replicas of a dump (see the module doc).

    :raises UsageError: (exit 2) the dump holds nothing to check, one rank only, or ranks that
        disagree on the job's world size.
    :raises DumpError: (exit 2) ``path`` holds no dump.
    """
    root = Path(path)
    if not root.is_dir():
        raise DumpError(f"{root} is not a directory; pass the dump directory (torchparity.dump's path)")
    notes: list[str] = []
    sources: set[str] = set()
    if (root / SUBDIR).is_dir() and any((root / SUBDIR).glob("rank*.jsonl")):
        values, world, steps = _from_hashes(root, notes)
        sources.add("hash")
    else:
        values, world, steps = _from_records(root, notes, sources)
    ranks = sorted(world)
    if not values:
        raise UsageError(f"{root} {NOTHING_TO_CHECK}")
    sizes = {r: w for r, w in world.items() if w is not None}
    if len(set(sizes.values())) > 1:
        by = ", ".join(f"rank {r}: {w}" for r, w in sorted(sizes.items()))
        raise UsageError(f"{root}: the ranks disagree on the world size ({by}); were two jobs dumped into one "
                         f"directory? Check each job's dump separately")
    if len(ranks) < 2:
        raise UsageError(f"{root} holds rank {ranks[0] if ranks else '?'} only; a replica check needs the dumps of "
                         f"two or more data-parallel ranks (dump every rank of the job)")
    expected = set(range(next(iter(sizes.values())))) if sizes else set(ranks)
    all_steps = sorted(set().union(*steps.values()))
    missing: list[str] = []
    absent = sorted(expected - set(ranks))
    if absent:
        missing.append(f"rank(s) {_span(absent)} of the {len(expected)}-rank job are not in {root}: their replicas "
                       f"were not compared")
    for s in all_steps:
        lacking = [r for r in ranks if s not in steps[r]]
        if lacking:
            missing.append(f"step {s}: rank(s) {_span(lacking)} hold no data for it: not compared there")
    findings: list[ReplicaFinding] = []
    compared = 0
    source = ",".join(sorted(sources))
    for (step, kind, name), vals in sorted(values.items(), key=lambda kv: (kv[0][0], _KIND_ORDER[kv[0][1]])):
        present = {r: v for r, v in vals.items()}
        if kind == "grad" and all(v is None for v in present.values()):
            continue  # a frozen parameter
        lacking = [r for r in ranks if step in steps[r] and r not in present]
        if lacking:
            missing.append(f"step {step}: {name} is missing on rank(s) {_span(lacking)} (the ranks recorded "
                           f"different parameters or ops)")
        if len(present) < 2:
            continue
        compared += 1
        f = vote(step, kind, name, present, source=source)
        if f is not None:
            findings.append(f)
    _mark_since(findings)
    return ReplicaReport(str(root), source, all_steps, ranks, compared, findings, _dedupe(missing), _dedupe(notes))


def _mark_since(findings: list[ReplicaFinding]) -> None:
    first: dict[tuple[str, str, int], int] = {}
    for f in findings:
        for r in f.ranks:
            s = first.setdefault((f.kind, f.name, r), f.step)
            f.since = s if f.since is None else min(f.since, s)


def _dedupe(lines: list[str], limit: int = 50) -> list[str]:
    out = list(dict.fromkeys(lines))
    return out if len(out) <= limit else out[:limit] + [f"... and {len(out) - limit} more"]


def _span(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def describe_source(source: str) -> str:
    """A readable account of what was compared."""
    return "; ".join(_SOURCE_TEXT.get(s, s) for s in source.split(",") if s)
