"""The (step, rank) shards of a job comparison: which exist, which can be compared, who compares
which, and the comparison of one shard into a small :class:`ShardResult`.

A *shard* is one ``stepS/rankR`` directory pair. :func:`plan_shards` lists both dumps' shards (from
the directory tree and headers only: no record is read), pairs them, and turns every shard that
cannot be compared (a rank or step missing on one side, different world sizes, a step recorded
fully on one side and lightly on the other) into a one-line message and a ``not compared``
result; :func:`assign` splits the comparable shards among workers by size. :func:`compare_shard`
runs the ordinary single-process :func:`~torchparity.compare.api.compare` on one shard and keeps
only its summary (counts, root cause), never its rows: a worker's memory is bounded by one shard.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import DumpError, TorchparityError
from . import scaler_tail

#: the verdict of a shard: compared (see ``diverged``/``complete``) or not compared (``reason``)
COMPARED, NOT_COMPARED = "compared", "not compared"
#: warnings kept per shard (the report dedupes them across shards)
MAX_SHARD_WARNINGS = 8


@dataclass
class ShardResult:
    """The summary of one (step, rank) shard: what a worker sends back (JSON, a few hundred bytes)."""

    step: int
    rank: int
    status: str = COMPARED  # COMPARED | NOT_COMPARED
    reason: str | None = None  # why it was not compared (one line)
    device_records: int = 0
    bench_records: int = 0
    n_compared: int = 0
    n_pass: int = 0
    n_warning: int = 0
    n_error: int = 0
    n_skip: int = 0
    n_not_compared: int = 0
    n_unchecked: int = 0
    n_damaged: int = 0
    complete: bool = True
    diverged: bool = False
    root_cause: dict[str, Any] | None = None  # Suspect.to_dict() of the shard's root cause
    suspects: int = 0
    mode: str | None = None
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    worker: str = ""  # host:pid of the worker that compared it
    peak_rss_mb: float = 0.0  # the worker's peak resident memory after this shard

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ShardResult":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def verdict(self) -> str:
        """``not compared``, ``diverged``, ``incomplete`` (compared in part) or ``agree``."""
        if self.status != COMPARED:
            return NOT_COMPARED
        if self.diverged:
            return "diverged"
        return "agree" if self.complete else "incomplete"


@dataclass
class ShardPlan:
    """What to compare: the comparable shards (with their device records.jsonl size, for balancing),
    the shards that cannot be compared (as results), and one-line messages about the gaps."""

    device_dump: str
    bench_dump: str
    shards: list[tuple[int, int, int]]  # (step, rank, bytes)
    missing: list[ShardResult] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"device_dump": self.device_dump, "bench_dump": self.bench_dump, "shards": self.shards,
                "missing": [m.to_dict() for m in self.missing], "messages": self.messages, "warnings": self.warnings}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ShardPlan":
        return cls(d["device_dump"], d["bench_dump"], [tuple(x) for x in d["shards"]],  # type: ignore[misc]
                   [ShardResult.from_dict(m) for m in d["missing"]], list(d["messages"]), list(d["warnings"]))


def _span(xs: list[int]) -> str:
    """``0-63`` / ``0, 2, 5``: a short list of numbers."""
    xs = sorted(set(xs))
    if not xs:
        return "none"
    if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2:
        return f"{xs[0]}-{xs[-1]}"
    return ", ".join(map(str, xs[:8])) + (f" ... ({len(xs)} in all)" if len(xs) > 8 else "")


def _world_size(reader: Any) -> int | None:
    u = reader.units[0]
    ws = (reader.header(u.step, u.rank) or {}).get("world_size")
    return ws if type(ws) is int and ws > 0 else None


def plan_shards(device_dump: str, bench_dump: str, step: int | None = None, rank: int | None = None) -> ShardPlan:
    """Pair the two dumps' (step, rank) shards; every gap becomes one message and not-compared results.

    :raises DumpError: a dump is missing or empty, the filter matches nothing, or the dumps share no shard.
    """
    from ..dump.reader import lost_line, open_dump
    from ..dump.schedule import like_pairs

    dev, ben = open_dump(device_dump), open_dump(bench_dump)
    warnings = [f"device dump: {w}" for w in dev.warnings] + [f"bench dump: {w}" for w in ben.warnings]
    sel = lambda k: (step is None or k[0] == step) and (rank is None or k[1] == rank)  # noqa: E731
    dkeys = {(u.step, u.rank) for u in dev.units if sel((u.step, u.rank))}
    bkeys = {(u.step, u.rank) for u in ben.units if sel((u.step, u.rank))}
    if not dkeys or not bkeys:
        side = "device" if not dkeys else "bench"
        raise DumpError(f"the {side} dump {device_dump if side == 'device' else bench_dump} has no shard for "
                        f"step={step} rank={rank}; check --step/--rank")
    common = sorted(dkeys & bkeys)
    if not common:
        raise DumpError(f"the dumps share no (step, rank): device has steps {_span([k[0] for k in dkeys])} ranks "
                        f"{_span([k[1] for k in dkeys])}, bench has steps {_span([k[0] for k in bkeys])} ranks "
                        f"{_span([k[1] for k in bkeys])}; pass the dumps of the same job")
    messages: list[str] = []
    missing: list[ShardResult] = []
    wd, wb = _world_size(dev), _world_size(ben)
    rd, rb = {k[1] for k in dkeys}, {k[1] for k in bkeys}
    if (wd and wb and wd != wb) or (rank is None and len(rd) != len(rb) and (wd is None or wb is None)):
        messages.append(f"the runs have different world sizes: device {wd or len(rd)} (ranks {_span(list(rd))}), "
                        f"bench {wb or len(rb)} (ranks {_span(list(rb))}); compared the ranks both have")
    for side, mine, other, other_name in (("device", dkeys, bkeys, "bench"), ("bench", bkeys, dkeys, "device")):
        reader = dev if side == "device" else ben
        tails = {k for k in mine - other if scaler_tail.is_scaler_tail(reader, *k)}
        messages += [scaler_tail.tail_line(side, *k) for k in sorted(tails)]
        only = sorted(mine - other - tails)
        if not only:
            continue
        steps_other = {k[0] for k in other}
        ranks_other = {k[1] for k in other}
        whole_steps = sorted({s for s, _ in only if s not in steps_other})
        whole_ranks = sorted({r for _, r in only if r not in ranks_other})
        for s in whole_steps:
            rs = [r for s2, r in only if s2 == s]
            messages.append(f"step {s} is missing from the {other_name} dump ({side} has it for ranks {_span(rs)}); "
                            f"not compared")
        for r in whole_ranks:
            ss = [s for s, r2 in only if r2 == r and s not in whole_steps]
            if ss:
                messages.append(f"rank {r} is missing from the {other_name} dump ({side} has it at steps {_span(ss)}); "
                                f"not compared")
        for s, r in only:
            if s not in whole_steps and r not in whole_ranks:
                messages.append(f"step{s}/rank{r} is missing from the {other_name} dump; not compared")
            missing.append(ShardResult(s, r, NOT_COMPARED, f"only in the {side} dump"))
    listed = {(x.step, x.rank) for x in missing}
    for side, reader in (("device", dev), ("bench", ben)):
        for s, r, by in reader.lost_units():
            if sel((s, r)):
                messages.append(f"{lost_line(s, r, by, side)}; not compared")
                if (s, r) not in listed:
                    listed.add((s, r))
                    missing.append(ShardResult(s, r, NOT_COMPARED, f"lost from the {side} dump"))
    kept, unlike = like_pairs(dev, ben, common)
    messages += unlike
    for s, r in sorted(set(common) - set(kept)):
        missing.append(ShardResult(s, r, NOT_COMPARED, "recorded fully on one side and lightly on the other"))
    shards = []
    for s, r in kept:
        f = dev.unit(s, r).path / "records.jsonl"
        shards.append((s, r, f.stat().st_size if f.is_file() else 0))
    return ShardPlan(str(dev.path), str(ben.path), shards, missing, messages, warnings)


def assign(shards: list[tuple[int, int, int]], workers: int) -> list[list[tuple[int, int]]]:
    """Split shards among ``workers`` so each gets about the same bytes (largest first, to the least
    loaded); each worker's list stays in (step, rank) order. Deterministic."""
    loads = [0] * workers
    out: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
    for s, r, size in sorted(shards, key=lambda x: (-x[2], x[0], x[1])):
        w = min(range(workers), key=lambda i: (loads[i], i))
        loads[w] += max(size, 1)
        out[w].append((s, r))
    return [sorted(x) for x in out]


@dataclass
class ShardOptions:
    """The compare options every shard is compared with (picklable, JSON-able)."""

    layer_mapping: Any = None  # a YAML path or a {device: bench} dict
    plugins: str | None = None  # plugins.yaml path (None: the default discovery)
    threshold: float = 10.0
    tolerance_dtype: str | None = None
    allow_partial: bool = False
    replay: int = 20


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (0 where ``resource`` is missing)."""
    try:
        import resource
        import sys

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(kb / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)
    except Exception:  # pragma: no cover - Windows
        return 0.0


def compare_shard(device_dump: str, bench_dump: str, step: int, rank: int, opts: ShardOptions) -> ShardResult:
    """Compare one shard with the ordinary compare (the same verdict as a whole-dump compare gives
    that shard); a shard that cannot be read or compared becomes a not-compared result."""
    from .api import compare

    import socket

    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        res = compare(device_dump, bench_dump, step=step, rank=rank, layer_mapping=opts.layer_mapping,
                      plugins=opts.plugins, threshold=opts.threshold, tolerance_dtype=opts.tolerance_dtype,
                      workers=1, allow_partial=opts.allow_partial, replay=opts.replay)
    except TorchparityError as exc:
        return ShardResult(step, rank, NOT_COMPARED, " ".join(str(exc).split()), elapsed_s=time.perf_counter() - t0,
                           worker=worker, peak_rss_mb=peak_rss_mb())
    except Exception as exc:  # a bug must not cost the other shards; the shard is reported, never passed
        return ShardResult(step, rank, NOT_COMPARED, f"internal error while comparing: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}", elapsed_s=time.perf_counter() - t0,
                           worker=worker, peak_rss_mb=peak_rss_mb())
    s = res.summary
    pair = (s.get("pairs") or [{}])[0]
    rc = res.root_cause.to_dict() if res.root_cause is not None else None
    out = ShardResult(step, rank, COMPARED, None,
                      device_records=int(pair.get("device_records", 0)), bench_records=int(pair.get("bench_records", 0)),
                      **{k: int(s.get(k, 0)) for k in ("n_compared", "n_pass", "n_warning", "n_error", "n_skip",
                                                         "n_not_compared", "n_unchecked", "n_damaged")},
                      complete=bool(s.get("complete", True)), diverged=bool(res.diverged), root_cause=rc,
                      suspects=len(res.suspects), mode=s.get("mode"),
                      warnings=list(s.get("warnings", []))[:MAX_SHARD_WARNINGS],
                      elapsed_s=round(time.perf_counter() - t0, 3), worker=worker)
    del res
    out.peak_rss_mb = peak_rss_mb()
    return out
