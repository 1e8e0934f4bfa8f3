"""Compare a whole job shard by shard on the cluster's own engine (``torch.distributed``), or in a
local process pool without a launcher.

    torchrun --nproc-per-node N -m torchparity compare DEV BENCH -o OUT
    srun -N 2 --ntasks-per-node 8 python -m torchparity compare DEV BENCH -o OUT
    torchparity compare DEV BENCH --distributed -j 4 -o OUT          # no launcher: a local pool

Under a launcher (torchrun: ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``; SLURM's srun:
``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS`` with ``MASTER_ADDR`` from the first host of
``SLURM_STEP_NODELIST``), worker 0 plans the shards (:func:`~.shards.plan_shards`) and broadcasts
the plan; each worker compares its slice one shard at a time (memory bounded by one shard, never
the job); the small per-shard summaries are gathered on worker 0 over gloo as JSON bytes in
``uint8`` tensors (nothing is pickled), and worker 0 writes one report
(:mod:`.job_report`). Worker 0 exits with the job's code (0 agree, 1 divergence, 2 not everything
compared), which torchrun and srun report as the job's; the others exit 0 once their part is
gathered (exiting non-zero first would make torchrun kill worker 0 before it wrote the report).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

from ..errors import TorchparityError, UsageError
from ..workers import automatic_workers_allowed, map_jobs
from . import job_report
from .job_report import JobResult
from .shards import ShardOptions, ShardPlan, ShardResult, assign, compare_shard, plan_shards

log = logging.getLogger("torchparity")

#: seconds a worker waits for the others to join (and for each collective)
INIT_TIMEOUT_S = float(os.environ.get("TORCHPARITY_DIST_TIMEOUT", "1800"))
#: MASTER_PORT under SLURM when none is set: this base plus the job id modulo 1000
SLURM_PORT_BASE = 29500


# ------------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------------


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[07-09,12],gpu3`` -> ``node07``)."""
    nodelist = nodelist.strip()
    m = re.match(r"^([^,\[]+)(?:\[([^\]]*)\])?", nodelist)
    if not m:
        raise UsageError(f"SLURM_NODELIST {nodelist!r} is not a node list; set MASTER_ADDR to the first node's host name")
    prefix, rng = m.group(1), m.group(2)
    if not rng:
        return prefix
    return prefix + rng.split(",")[0].split("-")[0]


def launcher_env(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """``{rank, world_size, master_addr, master_port, launcher}`` when this process is one of several
    started by torchrun or srun; None otherwise (or when the launcher started a single process)."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        except ValueError:
            raise UsageError(f"RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} are not whole numbers; "
                             f"start the compare with torchrun or srun") from None
        if world <= 1:
            return None
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise UsageError("RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; start the compare with "
                             "torchrun, or set both")
        return {"rank": rank, "world_size": world, "master_addr": env["MASTER_ADDR"],
                "master_port": int(env["MASTER_PORT"]), "launcher": "torchrun"}
    # srun sets SLURM_STEP_NUM_TASKS for the tasks of a job step; a batch script (one process) does not
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        try:
            rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"])
        except ValueError:
            raise UsageError(f"SLURM_PROCID={env['SLURM_PROCID']!r} / SLURM_STEP_NUM_TASKS="
                             f"{env['SLURM_STEP_NUM_TASKS']!r} are not whole numbers") from None
        if world <= 1:
            return None
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        addr = env.get("MASTER_ADDR") or (first_host(nodes) if nodes else None)
        if not addr:
            raise UsageError("srun started this compare but neither MASTER_ADDR nor SLURM_NODELIST is set; "
                             "export MASTER_ADDR=<first node>")
        port = int(env.get("MASTER_PORT") or SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0") or 0) % 1000)
        return {"rank": rank, "world_size": world, "master_addr": addr, "master_port": port, "launcher": "srun"}
    return None


def launched(env: dict[str, str] | None = None) -> bool:
    """True when torchrun or srun started this process, even as the only worker (then the job
    compare runs locally: a launcher means a job, whose report is the job report)."""
    env = os.environ if env is None else env
    return ("RANK" in env and "WORLD_SIZE" in env) or ("SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env)


# ------------------------------------------------------------------------------------------------
# gloo transport: JSON bytes in uint8 tensors
# ------------------------------------------------------------------------------------------------


def _to_tensor(payload: bytes) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.frombuffer(payload, dtype=np.uint8).copy()) if payload else torch.zeros(0, dtype=torch.uint8)


def broadcast_json(obj: Any, src: int = 0) -> Any:
    """``obj`` (JSON-able, given on ``src``) on every worker."""
    import torch
    import torch.distributed as dist

    payload = json.dumps(obj).encode() if dist.get_rank() == src else b""
    n = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(n, src)
    buf = _to_tensor(payload) if dist.get_rank() == src else torch.zeros(int(n.item()), dtype=torch.uint8)
    dist.broadcast(buf, src)
    return json.loads(buf.numpy().tobytes().decode())


def gather_json(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every worker's ``obj`` (JSON-able) on ``dst`` (in worker order); None on the others."""
    import torch
    import torch.distributed as dist

    payload = json.dumps(obj).encode()
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64))
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[:len(payload)] = _to_tensor(payload)
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)] if dist.get_rank() == dst else None
    dist.gather(buf, bufs, dst=dst)
    if bufs is None:
        return None
    return [json.loads(b[:int(n.item())].numpy().tobytes().decode()) for b, n in zip(bufs, sizes)]


# ------------------------------------------------------------------------------------------------
# the job
# ------------------------------------------------------------------------------------------------


def compare_job(device_dump: str | os.PathLike[str], bench_dump: str | os.PathLike[str],
                output_dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
                rank: int | None = None, formats: str | Sequence[str] | None = None,
                layer_mapping: Any = None, plugins: str | None = None, threshold: float = 10.0,
                tolerance_dtype: str | None = None, workers: int | None = None, allow_partial: bool = False,
                replay: int = 20, launcher: dict[str, Any] | None | bool = True) -> JobResult:
    """Compare a multi-rank, multi-step job shard by shard and return one :class:`JobResult`.

    :param workers: local pool size when no launcher started this process (default: CPU count,
        at most one per shard; one from a script without the ``__main__`` guard:
        :mod:`torchparity.workers`); ignored under a launcher (one worker per launched process).
    :param launcher: True: detect torchrun/srun from the environment; False: always a local pool;
        or a :func:`launcher_env` dict.
    :param formats: with ``output_dir``, also the detailed reports (these reporters) of the shard
        holding the first divergence, in ``OUT/first_divergence``.
    Other parameters as :func:`torchparity.compare`. Raises :class:`DumpError` (exit 2) when the
    dumps share no shard at all; every smaller gap is a not-compared shard in the report.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UsageError(f"workers must be a whole number >= 1 (or None: automatic), got {workers!r}")
    opts = ShardOptions(layer_mapping=layer_mapping, plugins=plugins, threshold=threshold,
                        tolerance_dtype=tolerance_dtype, allow_partial=allow_partial, replay=replay)
    env = launcher_env() if launcher is True else (launcher or None)
    t0 = time.perf_counter()
    if env is None:
        plan = plan_shards(str(device_dump), str(bench_dump), step, rank)
        results = _local(plan, opts, workers)
    else:
        got = _distributed(env, str(device_dump), str(bench_dump), step, rank, opts, t0)
        if isinstance(got, int):  # not the leader: its part is done (0), or the plan failed (leader says why)
            return JobResult({"exit_code": got}, leader=False)
        plan, results = got
    job = _merge(plan, results, t0)
    if env is not None:
        job.summary["launcher"] = {"name": env["launcher"], "world_size": env["world_size"]}
    if output_dir is not None:
        job.reports = job_report.write(job, output_dir)
        job.reports += _first_shard_reports(job, output_dir, formats, opts)
    return job


def _merge(plan: ShardPlan, results: list[ShardResult], t0: float) -> JobResult:
    return job_report.merge(results + plan.missing, plan.messages, plan.warnings, job_report.worker_stats(results),
                            plan.device_dump, plan.bench_dump, time.perf_counter() - t0)


def _local(plan: ShardPlan, opts: ShardOptions, workers: int | None) -> list[ShardResult]:
    """Compare the plan's shards here (one worker) or in a spawned pool, one shard per task, largest first."""
    n = len(plan.shards)
    if workers is None:  # from a script without the __main__ guard: one process (torchparity.workers)
        workers = max(1, min(os.cpu_count() or 1, n)) if automatic_workers_allowed() else 1
    jobs = [(plan.device_dump, plan.bench_dump, s, r, opts)
            for s, r, _ in sorted(plan.shards, key=lambda x: (-x[2], x[0], x[1]))]
    return map_jobs(_compare_shard_job, jobs, workers)


def _compare_shard_job(job: tuple[Any, ...]) -> ShardResult:
    return compare_shard(*job)


def _distributed(env: dict[str, Any], dev: str, ben: str, step: int | None, rank: int | None,
                 opts: ShardOptions, t0: float) -> tuple[ShardPlan, list[ShardResult]] | int:
    """This worker's part; worker 0 gets (plan, every result), the others their exit code (0)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("this torch has no torch.distributed; compare without a launcher (--distributed -j N)")
    me = env["rank"]
    os.environ.setdefault("MASTER_ADDR", str(env["master_addr"]))
    os.environ.setdefault("MASTER_PORT", str(env["master_port"]))
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", init_method="env://", rank=me, world_size=env["world_size"],
                                timeout=timedelta(seconds=INIT_TIMEOUT_S))
    try:
        msg: dict[str, Any] = {}
        if me == 0:
            try:
                plan0 = plan_shards(dev, ben, step, rank)
                msg = {"plan": plan0.to_dict(), "slices": assign(plan0.shards, dist.get_world_size())}
            except TorchparityError as exc:
                msg = {"error": str(exc), "exit_code": exc.exit_code}
        msg = broadcast_json(msg)
        if "error" in msg:
            if me == 0:
                raise TorchparityError(msg["error"])
            return 0  # the leader prints the one-line error and exits 2
        plan = ShardPlan.from_dict(msg["plan"])
        mine = [compare_shard(plan.device_dump, plan.bench_dump, s, r, opts) for s, r in msg["slices"][me]]
        gathered = gather_json([x.to_dict() for x in mine])
        if gathered is None:
            return 0
        return plan, [ShardResult.from_dict(d) for part in gathered for d in part]
    finally:
        if own:
            _leave_group(dist)


def _leave_group(dist: Any) -> None:
    """Leave the gloo group this compare created. Every worker waits for the others first (a
    barrier), so none tears the group down under a peer. On torch 2.1 the group is not destroyed at
    all: there ``destroy_process_group`` could block for good once the peer process had exited
    (found by the lowest CI job: worker 0 waited in it after worker 1 was gone); the process exits
    right after the job anyway."""
    try:
        dist.barrier()
    except Exception:  # pragma: no cover - a peer died: nothing left to wait for
        pass
    if _DESTROY_SAFE:
        try:
            dist.destroy_process_group()
        except Exception:  # pragma: no cover - a teardown error must not cost the job's report
            pass


#: torch >= 2.2: destroying a gloo group after the job is safe (see _leave_group)
_DESTROY_SAFE = tuple(int(x) for x in __import__("torch").__version__.split("+")[0].split(".")[:2]) >= (2, 2)


def _first_shard_reports(job: JobResult, output_dir: str | os.PathLike[str], formats: Any,
                         opts: ShardOptions) -> list[Path]:
    """The ordinary reports (xlsx, html, json ... as ``formats`` asks) of the shard holding the first
    divergence, in ``OUT/first_divergence``: the rows of one shard, never the job's."""
    fd = job.first_divergence
    if not fd:
        return []
    from .api import compare

    if formats is None:  # every enabled reporter but the console one (the job headline is the console's)
        from ..plugins import get_registry

        formats = [n for n in get_registry(opts.plugins).reporters if n != "log"]
    out = Path(output_dir) / "first_divergence"
    try:
        res = compare(job.summary["device_dump"], job.summary["bench_dump"], out, step=fd["step"], rank=fd["rank"],
                      formats=formats, layer_mapping=opts.layer_mapping, plugins=opts.plugins,
                      threshold=opts.threshold, tolerance_dtype=opts.tolerance_dtype, workers=1,
                      allow_partial=opts.allow_partial, replay=opts.replay)
    except TorchparityError as exc:  # pragma: no cover - it was compared a moment ago
        job.summary["warnings"].append(f"the detailed report of step{fd['step']}/rank{fd['rank']} failed: {exc}")
        return []
    return [p for paths in res.reports.values() for p in paths]
