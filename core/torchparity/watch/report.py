"""``DIR/watch-report.json``: what the watchdog found (format in docs/watch.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .confirm import Confirmation
from .snapshots import History
from .triggers import Trigger

REPORT_FORMAT = "torchparity-watch-report"


def build_report(trig: Trigger, conf: Confirmation, rank: int, world: int, history: History) -> dict[str, Any]:
    """The report of one confirmed trigger (JSON-ready)."""
    return {
        "format": REPORT_FORMAT, "version": 1,
        "step": trig.step, "trigger": trig.to_dict(), "reproducible": conf.reproducible,
        "verdict": "reproducible" if conf.reproducible else "transient",
        "root_cause": conf.root_cause, "rank": rank, "world_size": world,
        "snapshot_step": history.snapshot_step, "snapshot_interval": history.interval,
        "replayed": conf.replayed, "replay_consistent": all(r["same"] for r in conf.replayed),
        "rerun": conf.rerun, "dump": conf.dump, "case": conf.case,
        "snapshot_bytes": history.snapshot.nbytes if history.snapshot else 0, "host_bytes_peak": history.peak,
        "seconds_to_report": round(conf.seconds, 3),
    }


def write_report(report: dict[str, Any], out: Path, rank: int, index: int) -> Path:
    """Write atomically: ``watch-report.json`` (rank 0, or the only rank), ``watch-report.rank{R}.json``
    on other ranks; a second trigger's report gets ``.{n}`` before ``.json``."""
    name = "watch-report" + (f".rank{rank}" if rank else "") + (f".{index}" if index else "") + ".json"
    path = out / name
    report["path"] = str(path)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
