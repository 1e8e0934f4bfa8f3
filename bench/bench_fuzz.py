"""Long fuzz run: the engine of tests/fuzz/test_fuzz_readers.py over >= 10,000 cases.

Each case mutates a fresh copy of a pristine input (built once per run) with a seeded
:class:`random.Random` (truncation, byte flips, deleted/empty files, duplicated/reordered/dropped
lines, JSON values of the wrong type) and checks the properties of the CI test: no traceback, one-
line errors naming the file, nothing corrupted or missing reported as agreeing, no pickle.

Counts per reader: cases, tracebacks, false passes, hangs (a case over ``--case-timeout`` s) and
CPU seconds of the cases; outcomes (refused, divergence, agree-unchanged, ...). Work is cheap per
case: pristine inputs are built once, copies are mutated in ``/dev/shm`` when present, plugins and
modules are loaded once per worker, and only every ``--cli-every``-th dump case also runs the CLI
(``compare`` + ``info``) in-process; the others go through ``load_dump`` / ``compare()``.

    python bench/bench_fuzz.py --cases 10000 --workers 2 [--out bench/results/fuzz.md]
    python bench/bench_fuzz.py --only msprobe --seed 1234 --cases 1      # replay one case
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: share of the cases per reader (dumps cost the most and matter the most)
SHARES = {"torchparity-statistics": 0.25, "torchparity-tensor": 0.25, "msprobe": 0.2,
          "plugins.yaml": 0.1, "layer-mapping": 0.1, "replay-case": 0.1}

_ENGINE: Any = None
_BASES: dict[str, Path] = {}


class Hang(BaseException):
    """A case ran past its time limit (a BaseException: the engine's handlers must not catch it)."""


def engine() -> Any:
    """tests/fuzz/test_fuzz_readers.py as a module (registered, so its dataclasses resolve)."""
    global _ENGINE
    if _ENGINE is None:
        path = ROOT / "tests" / "fuzz" / "test_fuzz_readers.py"
        spec = importlib.util.spec_from_file_location("tp_fuzz_engine", path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["tp_fuzz_engine"] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        _ENGINE = mod
    return _ENGINE


def build_bases(root: Path) -> dict[str, Path]:
    """The pristine inputs, built once per run."""
    eng = engine()
    return {"torchparity-statistics": eng.make_real_dump(root / "stats", "statistics"),
            "torchparity-tensor": eng.make_real_dump(root / "tensor", "tensor"),
            "msprobe": eng.make_msprobe_dump(root / "ms"),
            "replay-case": eng.make_case(root / "case")}


def _init_worker(bases: dict[str, Path], scratch: str) -> None:
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.CRITICAL)  # the reader's warnings are checked, not printed
    tempfile.tempdir = scratch
    _BASES.update(bases)
    engine()
    import torchparity.compare.api  # noqa: F401 - imported once per worker, not per case


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def run_case(task: tuple[str, int, bool, float]) -> tuple[str, int, str, str, float]:
    """(reader, seed, status, detail, seconds); status: ok | traceback | false-pass | hang | error."""
    reader, seed, cli, limit = task
    eng = engine()
    rng = random.Random(seed)
    t0 = time.process_time()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with eng.scratch() as tmp:
            if reader.startswith("torchparity"):
                out = eng.case_torchparity(rng, _BASES[reader], tmp, cli=cli)
            elif reader == "msprobe":
                out = eng.case_msprobe(rng, _BASES[reader], tmp, cli=cli)
            elif reader == "plugins.yaml":
                out = eng.case_plugins_yaml(rng, tmp)
            elif reader == "layer-mapping":
                out = eng.case_layer_mapping(rng, tmp)
            else:
                out = eng.case_replay(rng, _BASES[reader], tmp)
        status, detail = "ok", out.result
    except Hang:
        status, detail = "hang", f"over {limit} s"
    except eng.Traceback as exc:
        status, detail = "traceback", str(exc)[:400]
    except eng.FalsePass as exc:
        status, detail = "false-pass", str(exc)[:400]
    except AssertionError as exc:  # an error that does not name its file
        status, detail = "error", str(exc)[:400]
    except Exception as exc:  # the harness itself
        status, detail = "harness", f"{type(exc).__name__}: {exc} {traceback.format_exc(limit=3)[-300:]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return reader, seed, status, detail, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10000, help="cases in all (split by reader, see SHARES)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes")
    ap.add_argument("--seed", type=int, default=0, help="seed of the first case (case k uses seed + k)")
    ap.add_argument("--only", choices=sorted(SHARES), help="fuzz one reader only")
    ap.add_argument("--cli-every", type=int, default=10, help="every N-th dump case also runs the CLI")
    ap.add_argument("--case-timeout", type=float, default=30.0, help="seconds before a case counts as a hang")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz.md"))
    a = ap.parse_args()
    if a.cases < 1 or a.workers < 1 or a.cli_every < 1 or not a.case_timeout > 0:
        ap.error("--cases, --workers, --cli-every and --case-timeout must be positive")
    shares = {a.only: 1.0} if a.only else SHARES
    tasks: list[tuple[str, int, bool, float]] = []
    for reader, share in shares.items():
        n = max(1, round(a.cases * share)) if not a.only else a.cases
        tasks += [(reader, a.seed + k, k % a.cli_every == 0, a.case_timeout) for k in range(n)]
    random.Random(0).shuffle(tasks)  # mix cheap and costly cases across the workers

    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix="tpfuzz-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    try:
        logging.disable(logging.CRITICAL)
        bases = build_bases(scratch / "bases")
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        seconds: dict[str, float] = defaultdict(float)
        failures: dict[str, list[str]] = defaultdict(list)
        if a.workers == 1:
            _init_worker(bases, str(scratch))
            results = map(run_case, tasks)
            pool = None
        else:
            import multiprocessing as mp

            pool = mp.get_context("spawn").Pool(a.workers, _init_worker, (bases, str(scratch)))
            results = pool.imap_unordered(run_case, tasks, chunksize=8)
        done = 0
        for reader, seed, status, detail, secs in results:
            done += 1
            counts[reader]["cases"] += 1
            counts[reader][status if status != "ok" else f"ok:{detail}"] += 1
            seconds[reader] += secs
            if status != "ok" and sum(f.startswith(status) for f in failures[reader]) < 3:  # 3 of each kind
                failures[reader].append(f"{status}: `--only {reader} --seed {seed} --cases 1`: {detail}")
            if done % 500 == 0:
                print(f"  {done}/{len(tasks)} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"fuzz: {sum(c['cases'] for c in counts.values())} cases, {a.workers} workers, seed {a.seed}, "
             f"CLI every {a.cli_every} dump cases, case limit {a.case_timeout:g} s; wall {wall:.0f} s; "
             f"load average {load0:.2f} at start, {load1:.2f} at end",
             "",
             "| reader | cases | tracebacks | false passes | hangs | other errors | CPU s | outcomes |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    bad = 0
    for reader in shares:
        c = counts[reader]
        outcomes = ", ".join(f"{k[3:]} {v}" for k, v in sorted(c.items()) if k.startswith("ok:"))
        other = c["error"] + c["harness"]
        bad += c["traceback"] + c["false-pass"] + c["hang"] + other
        lines.append(f"| {reader} | {c['cases']} | {c['traceback']} | {c['false-pass']} | {c['hang']} | {other} "
                     f"| {seconds[reader]:.0f} | {outcomes} |")
    for reader, fs in failures.items():
        lines += ["", f"{reader}, first failures (replay with `python bench/bench_fuzz.py ...`):"]
        lines += [f"- {f}" for f in fs]
    text = "\n".join(lines) + "\n"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    print(text)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
