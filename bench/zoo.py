"""Run the model zoo (tests/zoo) and write its table: model x feature -> OK / false alarm / miss / crash.

    python bench/zoo.py --out bench/results/zoo.md -j 2
    python bench/zoo.py --models llama-eager,lstm --features dump-aten,online-bf16 --out /tmp/z.md
    python bench/zoo.py --list

The cells of a model run in a subprocess (``--cell MODEL F1,F2,...``) with a timeout per cell, so
a tool that aborts the process (a ``double free``, a segfault) or hangs is recorded as the
``crash`` of the cell in flight, and a fresh process runs the remaining cells (also after a cell
that crashed with an exception: the tool may have left state behind). The child prints
``ZOO-START feature`` and ``ZOO-RESULT {json}`` lines; anything else on its output is ignored.
Results are also written as JSON beside the Markdown table (``--out`` with ``.json``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO_DIR = ROOT / "tests" / "zoo"
MARK = "ZOO-RESULT "
START = "ZOO-START "


def _import_zoo() -> tuple[dict, dict]:
    sys.path.insert(0, str(ZOO_DIR))
    from zoo_cells import FEATURES  # noqa: PLC0415
    from zoo_models import ZOO  # noqa: PLC0415

    return ZOO, FEATURES


def run_child(model: str, features: list[str], workdir: str) -> None:
    """The ``--cell`` entry point: run cells of one model here, one after the other, printing
    ``ZOO-START feature`` before and ``ZOO-RESULT {json}`` after each. Stops after a ``crash``
    (the tool may have left state behind): the runner starts a fresh process for the rest."""
    _import_zoo()
    from zoo_cells import run_cell  # noqa: PLC0415

    for f in features:
        print(START + f, flush=True)
        cell = run_cell(model, f, Path(workdir) / f)
        print(MARK + json.dumps({"feature": f, **cell.to_dict()}), flush=True)
        if cell.status == "crash":
            return


def run_model(model: str, features: list[str], timeout: float, tmp: Path) -> dict[str, dict]:
    """Run every feature of ``model`` in as few subprocesses as possible: a fresh process after a
    crash, an abort, a signal or a timeout (each recorded as the ``crash`` of the cell in flight)."""
    results: dict[str, dict] = {}
    while len(results) < len(features):
        todo = [f for f in features if f not in results]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", model, ",".join(todo),
               "--workdir", str(tmp / model)]
        got = run_cmd(cmd, timeout, todo)
        if not got:  # the child ended cleanly without running anything: do not loop forever
            got = {f: {"status": "crash", "note": "the cell process ended without a result", "seconds": 0.0} for f in todo}
        results.update(got)
    return results


def run_cmd(cmd: list[str], timeout: float, features: list[str]) -> dict[str, dict]:
    """Run a child and read its ``ZOO-RESULT`` lines as they come. The cell in flight when the
    child ends without its result, or runs past ``timeout`` seconds (then the child is killed), is
    a ``crash`` saying how the process ended and the last line of its stderr."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    results: dict[str, dict] = {}
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for ln in p.stdout:  # type: ignore[union-attr]
                lines.put(ln.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        started, t_start, why = None, time.perf_counter(), ""
        while True:
            try:
                line = lines.get(timeout=max(0.1, t_start + timeout - time.perf_counter()))
            except queue.Empty:
                p.kill()
                why = f"timed out after {timeout:.0f} s"
                break
            if line is None:
                break
            if line.startswith(START):
                started, t_start = line[len(START):], time.perf_counter()
            elif line.startswith(MARK):
                r = json.loads(line[len(MARK):])
                results[r.pop("feature")] = r
                started, t_start = None, time.perf_counter()
        rc = p.wait()
        if not why:
            why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        err.seek(0)
        tail = [ln for ln in err.read().splitlines() if ln.strip()][-1:] or [""]
    in_flight = started or next((f for f in features if f not in results), None)
    if in_flight is not None and (started is not None or not results):
        results[in_flight] = {"status": "crash", "note": f"process died ({why}): {tail[0][:200]}",
                              "seconds": round(time.perf_counter() - t_start, 1)}
    return results


SYMBOL = {"OK": "OK", "false alarm": "**FALSE ALARM**", "miss": "**MISS**", "crash": "**CRASH**", "n/a": "n/a"}


def write_table(results: dict, models: list[str], features: list[str], out: Path, header: str) -> None:
    """The Markdown table (features as rows, models as columns), then every non-OK cell's note."""
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [header, "", "Totals: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), "",
             "| feature | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for f in features:
        cells = []
        for m in models:
            r = results.get((m, f))
            cells.append("" if r is None else f"{SYMBOL.get(r['status'], r['status'])} {r['seconds']:.0f}s")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines += ["", "## What was reported (every cell that is not OK)", ""]
    for f in features:
        for m in models:
            r = results.get((m, f))
            if r is not None and r["status"] != "OK":
                note = r["note"].replace("|", "\\|")
                lines.append(f"- **{m} / {f}** ({r['status']}): {note}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(
        [{"model": m, "feature": f, **r} for (m, f), r in sorted(results.items())], indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "zoo.md")
    ap.add_argument("--models", default="", help="comma-separated (default: all)")
    ap.add_argument("--features", default="", help="comma-separated (default: all)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    ap.add_argument("--list", action="store_true", help="list models and features")
    ap.add_argument("--cell", nargs=2, metavar=("MODEL", "FEATURE"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.cell:
        run_child(a.cell[0], a.cell[1].split(","), a.workdir)
        return 0
    zoo, features = _import_zoo()
    if a.list:
        print("models:  ", " ".join(zoo))
        print("features:", " ".join(features))
        return 0
    models = [m for m in a.models.split(",") if m] or list(zoo)
    feats = [f for f in a.features.split(",") if f] or list(features)
    unknown = [m for m in models if m not in zoo] + [f for f in feats if f not in features]
    if unknown:
        print(f"bench/zoo.py: unknown model/feature {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    results: dict = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp, cf.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futs = {pool.submit(run_model, m, feats, a.timeout, Path(tmp)): m for m in models}
        for fut in cf.as_completed(futs):
            m = futs[fut]
            for f, r in fut.result().items():
                results[(m, f)] = r
                print(f"{m:12s} {f:26s} {r['status']:12s} {r['seconds']:6.1f}s  {r['note'][:150]}", flush=True)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    header = (f"# Model zoo: where torchparity stands\n\nDate {datetime.date.today()}, "
              f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores (shared), "
              f"torch {torch.__version__}, transformers {transformers.__version__}, "
              f"wall {time.perf_counter() - t0:.0f} s.\n\nCommand: `python bench/zoo.py "
              + " ".join(argv if argv is not None else sys.argv[1:]) + "`\n\n"
              "Cells: OK; FALSE ALARM (a problem reported on a clean run, or no conclusion); MISS (a "
              "planted fault not named, or named wrongly); CRASH (an exception or a dead process); "
              "n/a (does not apply). Meaning of each feature: docs/zoo.md.")
    write_table(results, models, feats, a.out, header)
    print(f"wrote {a.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
