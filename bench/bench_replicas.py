"""ReplicaCheck overhead on a 4-rank gloo DDP job of the bench model.

    python bench/bench_replicas.py              # 4 ranks, the bench model, writes bench/results/replicas.md
    python bench/bench_replicas.py --quick      # the quick model, 2 rounds (a smoke test)

Each rank trains the bench model (bench/_common.py: forward + cross-entropy + backward + AdamW)
wrapped in DDP (gloo, one torch thread per rank). In the same four processes, rounds interleave
the job without the check and the job inside ``torchparity.ReplicaCheck(ddp, opt)``
(:func:`_common.time_configs`); the reported time is rank 0's median per step (all ranks move in
lockstep: every step has DDP's all-reduce). ``torch.distributed.all_gather`` is wrapped by a
counter: the check must run exactly one per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
WORLD = 4


def worker(rank: int, init: str, out: str, quick: bool, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchparity
    from _common import Bench, machine, model_line, time_configs

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    gathers = {"n": 0}
    real_all_gather = dist.all_gather

    def counting_all_gather(*args, **kwargs):  # noqa: ANN002, ANN003
        gathers["n"] += 1
        return real_all_gather(*args, **kwargs)

    dist.all_gather = counting_all_gather
    bench = Bench("cpu", quick=quick)
    line = model_line(bench)
    bench.model = DDP(bench.model)
    bench.opt = torch.optim.AdamW(bench.model.parameters(), lr=1e-4)
    checks: list = []

    def with_check():  # noqa: ANN202
        c = torchparity.ReplicaCheck(bench.model, bench.opt)
        checks.append(c)
        return c

    timings = time_configs(bench, {"DDP (no check)": None, "DDP + ReplicaCheck": with_check},
                           rounds=rounds, warmup=1, steps=steps, progress=rank == 0)
    n_steps = sum(c.step for c in checks)
    from torchparity.replicas.hashing import stacked_hashes

    params = list(bench.model.parameters())
    bench.step()  # gradients of the last step stay: the zero_grad sets them to None, so make fresh ones
    logits = bench.model(bench.inputs)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), bench.targets.reshape(-1)).backward()
    hash_times = []
    for _ in range(5):  # the check's own compute, measured directly (no collective): less noisy than the ratio
        t0 = time.perf_counter()
        stacked_hashes([p.grad for p in params]).tolist()
        stacked_hashes(params).tolist()
        hash_times.append(time.perf_counter() - t0)
    import statistics

    hash_s = statistics.median(hash_times)
    result = {"rank": rank, "timings": {k: {"per_step": t.per_step, "error": t.error} for k, t in timings.items()},
              "gathers": gathers["n"], "check_steps": n_steps, "findings": sum(len(c.findings) for c in checks),
              "model": line, "machine": machine(),
              "params": sum(1 for _ in bench.model.parameters()), "hash_s": hash_s}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--worker", nargs=2, metavar=("RANK", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    rounds = a.rounds or (2 if a.quick else 5)
    steps = a.steps or (2 if a.quick else 3)
    if a.worker:
        rank, work = int(a.worker[0]), a.worker[1]
        worker(rank, os.path.join(work, "init"), work, a.quick, rounds, steps)
        return
    with tempfile.TemporaryDirectory() as work:
        args = [sys.executable, __file__, "--rounds", str(rounds), "--steps", str(steps)] + (["--quick"] if a.quick else [])
        t0 = time.time()
        procs = [subprocess.Popen(args + ["--worker", str(r), work]) for r in range(WORLD)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")
        results = [json.loads(Path(work, f"rank{r}.json").read_text()) for r in range(WORLD)]
        wall = time.time() - t0
    import statistics

    r0 = results[0]
    med = {k: statistics.median(v["per_step"]) for k, v in r0["timings"].items()}
    base, chk = med["DDP (no check)"], med["DDP + ReplicaCheck"]
    per_step_gathers = [r["gathers"] / max(r["check_steps"], 1) for r in results]
    lines = [
        "# ReplicaCheck overhead (bench/bench_replicas.py)", "",
        f"4-rank gloo DDP job, one torch thread per rank, {r0['model']}; {r0['params']} parameter tensors checked.",
        f"Machine: {r0['machine']['cpu']}; torch {r0['machine']['torch']}; {rounds} rounds x (1 warm-up + {steps} timed steps) "
        f"per configuration, interleaved in the same 4 processes; rank 0's median per step.", "",
        "| configuration | ms/step (median) | per-round ms/step | ratio |", "| --- | ---: | --- | ---: |",
    ]
    for k, v in r0["timings"].items():
        lines.append(f"| {k} | {med[k] * 1000:.1f} | {', '.join(f'{x * 1000:.0f}' for x in v['per_step'])} | "
                     f"{med[k] / base:.3f}x |")
    lines += ["", f"all_gathers per checked step, by rank: {', '.join(f'{x:g}' for x in per_step_gathers)} "
                  f"(target 1); replica findings on this clean job: {sum(r['findings'] for r in results)}.",
              f"Overhead {chk / base:.3f}x (target <= 1.05x). Whole run {wall:.0f} s.",
              "The check's own hashing (gradients + parameters, measured directly on each rank, median of 5): "
              + ", ".join(f"{r['hash_s'] * 1000:.1f}" for r in results) + " ms per step, "
              + f"{statistics.median(r['hash_s'] for r in results) / base * 100:.2f} % of the no-check step."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.quick:
        (HERE / "results" / "replicas.md").write_text(text)


if __name__ == "__main__":
    main()
