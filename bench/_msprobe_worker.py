"""msprobe side of bench_dump.py (run by it with the bench venv's python; not a project module).

Usage: ``BENCH_VENV/bin/python bench/_msprobe_worker.py CONFIG_NAME ROUNDS WARMUP STEPS DEVICE``.
Times the bench model with the tool off and under msprobe's ``PrecisionDebugger`` at one
setting, in this process (msprobe's debugger is a process-wide singleton, hence one process per
setting), and prints one JSON line.
The baseline is measured first (once created, msprobe's debugger leaves torch's APIs wrapped).
msprobe is driven the way its docs say: ``start(model)`` before the step, ``stop()`` and
``step()`` after it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, time_configs  # noqa: E402

#: name -> (msprobe task, level, summary_mode)
SETTINGS = {
    "msprobe L0 statistics": ("statistics", "L0", "statistics"),
    "msprobe L1 statistics": ("statistics", "L1", "statistics"),
    "msprobe mix statistics": ("statistics", "mix", "statistics"),
    "msprobe L1 md5": ("statistics", "L1", "md5"),
    "msprobe L1 tensor": ("tensor", "L1", None),
    "msprobe L0 tensor": ("tensor", "L0", None),
    "msprobe mix md5": ("statistics", "mix", "md5"),
    "msprobe L0 md5": ("statistics", "L0", "md5"),
    "msprobe mix tensor": ("tensor", "mix", None),
}


class _MsprobeRun:
    """Context: every bench step runs between ``debugger.start(model)`` and ``stop(); step()``.

    The debugger is created once per process (it is a singleton that patches torch's APIs for
    good); between rounds the step directories it wrote are deleted to bound disk use.
    """

    dbg = None

    def __init__(self, bench: Bench, task: str, level: str, summary: str | None, root: str) -> None:
        self.bench = bench
        if _MsprobeRun.dbg is None:
            from msprobe.pytorch import PrecisionDebugger

            section: dict = {"scope": [], "list": [], "data_mode": ["all"]}
            if summary:
                section["summary_mode"] = summary
            cfg = {"task": task, "dump_path": os.path.join(root, "dump"), "rank": [], "step": [], "level": level,
                   task: section}
            path = os.path.join(root, "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            _MsprobeRun.dbg = PrecisionDebugger(config_path=path)
            _MsprobeRun.dump_dir = cfg["dump_path"]

    def __enter__(self) -> "_MsprobeRun":
        inner = self._inner = self.bench.step
        dbg, model = _MsprobeRun.dbg, self.bench.model

        def step():  # type: ignore[no-untyped-def]
            dbg.start(model=model)
            loss = inner()
            dbg.stop()
            dbg.step()
            return loss

        self.bench.step = step  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.bench.step = self._inner  # type: ignore[method-assign]
        for p in Path(_MsprobeRun.dump_dir).rglob("step*"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def main() -> int:
    name, rounds, warmup, steps, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    quick = len(sys.argv) > 6 and sys.argv[6] == "quick"
    task, level, summary = SETTINGS[name]
    import importlib.util

    if importlib.util.find_spec("msprobe") is None:
        print("RESULT " + json.dumps({"name": name, "error": "msprobe (mindstudio-probe) is not installed"}))
        return 0

    bench = Bench(device, quick=quick)
    root = tempfile.mkdtemp(prefix="tp-bench-msprobe-")
    try:
        # the baseline first: once created, msprobe's debugger leaves torch's APIs wrapped
        off = time_configs(bench, {"tool off": None}, rounds=rounds, warmup=warmup, steps=steps,
                           progress=False)["tool off"]
        on = time_configs(bench, {name: lambda: _MsprobeRun(bench, task, level, summary, root)},
                          rounds=rounds, warmup=warmup, steps=steps, progress=False)[name]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    try:
        from importlib.metadata import version

        ver = version("mindstudio-probe")
    except Exception:  # pragma: no cover
        ver = "?"
    print("RESULT " + json.dumps({"name": name, "off": off.per_step, "on": on.per_step, "error": on.error,
                                  "version": ver}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
