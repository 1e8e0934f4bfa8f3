"""Calibrate the statistics-mode judge on the model zoo (docs/judge-calibration.md).

For every zoo model (tests/zoo/zoo_models.py) this dumps, at aten level (and api with ``--levels``):
the fp32 reference, the clean bf16 run, the clean fp16-autocast run, and bf16 runs with one op
planted x1.05 and x2 (forward matmul, backward matmul, softmax; planted like
tests/zoo/zoo_cells.planted_fault, with the emulated backend's fault injection). Then it compares
each low-precision dump with the fp32 one and records, per op family (:mod:`torchparity.compare.
error_model`), the distribution of the clean scores (max, p99, count) and the score of each planted
fault at the planted op (and whether it is the root cause).

    python bench/calibrate_judge.py --work /tmp/calib            # dump (cached) + score + table
    python bench/calibrate_judge.py --work /tmp/calib --models gpt2,cnn --no-dump
    python bench/calibrate_judge.py --work /tmp/calib --out docs/_calib.md

Dumps are kept under ``--work`` and reused (``--redump`` to redo them), so the judge can be changed
and re-scored in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))

PLANTS = [(w, f) for w in ("fwd-mm", "bwd-mm", "softmax") for f in (1.05, 2.0)]


def dump_model(model: str, work: Path, levels: list[str], redo: bool) -> dict[str, Any]:
    """Dump the clean and planted runs of one model (skipping what exists); returns the plants."""
    import zoo_cells as zc
    from zoo_models import ZOO

    spec = ZOO[model]
    meta_p = work / model / "plants.json"
    plants: dict[str, Any] = json.loads(meta_p.read_text()) if meta_p.exists() and not redo else {}
    for level in levels:
        for prec in ("fp32", "bf16", "fp16"):
            p = work / model / f"{prec}-{level}"
            if prec in spec.unsupported or (p.exists() and not redo):
                continue
            zc._dump(spec, prec, p, level=level)
        for where, factor in PLANTS:
            tag = f"fault-{where}-x{factor:g}-{level}"
            p = work / model / tag
            if p.exists() and not redo and tag in plants:
                continue
            op, attr, phase = zc._FAULT_SITES[where]
            module = getattr(spec, attr)
            if module is None:
                continue
            fault = zc._pin(spec, "bf16", op, module, phase, p.parent, kind="scale", factor=factor)
            inj = zc._dump(spec, "bf16", p, level=level, faults=[fault])
            plants[tag] = {"op": inj[0].op, "module": inj[0].module, "phase": inj[0].phase}
    meta_p.parent.mkdir(parents=True, exist_ok=True)
    meta_p.write_text(json.dumps(plants, indent=1))
    return plants


def score_model(model: str, work: Path, levels: list[str]) -> list[dict[str, Any]]:
    """Compare every dump of ``model`` with its fp32 reference; one result per comparison."""
    import numpy as np
    import torchparity
    from torchparity.compare import error_model

    plants = json.loads((work / model / "plants.json").read_text())
    out = []
    for level in levels:
        bench = work / model / f"fp32-{level}"
        tags = [f"bf16-{level}", f"fp16-{level}"] + [t for t in plants if t.endswith(f"-{level}")]
        for tag in tags:
            dev = work / model / tag
            if not dev.exists():
                continue
            res = torchparity.compare(str(dev), str(bench))
            rows = res.rows
            rec = rows[rows["device_record_id"] >= 0].drop_duplicates("device_record_id")
            fam = error_model.op_families(rec["op"].to_numpy(dtype=object))
            amp = rec["amplification"].to_numpy(dtype="float64")
            rc = res.root_cause
            item: dict[str, Any] = {
                "model": model, "level": level, "tag": tag, "diverged": bool(res.diverged),
                "root_cause": None if rc is None else f"{rc.op} in {rc.module!r}, {rc.phase}: {rc.reason}",
                "families": {},
            }
            for f in sorted(set(fam)):
                a = amp[(fam == f) & np.isfinite(amp)]
                if len(a):
                    item["families"][f] = {"n": int(len(a)), "max": float(a.max()),
                                           "p99": float(np.quantile(a, 0.99))}
            if tag.startswith("fault-"):
                pl = plants[tag]
                base = pl["op"].split(".")[1]
                at = rec[(rec["module"] == pl["module"]) & (rec["phase"] == pl["phase"])
                         & rec["op"].astype(str).str.contains(base, regex=False)]
                item["planted"] = pl
                item["planted_score"] = float(np.nanmax(at["amplification"].to_numpy(dtype="float64"))) if len(at) else None
                item["found"] = bool(rc is not None and rc.module == pl["module"] and rc.phase == pl["phase"]
                                     and (level != "aten" or rc.op.split(".")[1:2] == [base]))
            out.append(item)
    return out


def table(results: list[dict[str, Any]], threshold: float) -> str:
    """The calibration tables in Markdown."""
    import numpy as np

    lines = []
    clean = [r for r in results if not r["tag"].startswith("fault-")]
    fams: dict[str, list[tuple[float, float, int, str]]] = {}
    for r in clean:
        for f, v in r["families"].items():
            fams.setdefault(f"{f} ({r['tag'].split('-')[0]})", []).append((v["max"], v["p99"], v["n"], f"{r['model']}/{r['tag']}"))
    lines += ["### Clean low-precision runs vs fp32: amplification score per op family", "",
              f"threshold {threshold:g}; score = the larger channel score of an op (see above)", "",
              "| op family (run) | ops scored | p99 | max | margin (threshold / max) | worst at |", "|---|---|---|---|---|---|"]
    for f in sorted(fams, key=lambda k: -max(x[0] for x in fams[k])):
        mx = max(fams[f], key=lambda x: x[0])
        p99 = max(x[1] for x in fams[f])
        n = sum(x[2] for x in fams[f])
        lines.append(f"| {f} | {n} | {p99:.3g} | {mx[0]:.3g} | {threshold / mx[0] if mx[0] > 0 else float('inf'):.3g} | {mx[3]} |")
    lines += ["", "### Clean runs: root cause reported (must be none)", "",
              "| model | run | root cause |", "|---|---|---|"]
    for r in clean:
        lines.append(f"| {r['model']} | {r['tag']} | {('**' + r['root_cause'][:140] + '**') if r['root_cause'] else 'none'} |")
    faults = [r for r in results if r["tag"].startswith("fault-")]
    lines += ["", "### Planted faults (bf16 run, one op scaled): score at the planted op, root cause found", "",
              "| model | fault | planted op | score | found |", "|---|---|---|---|---|"]
    for r in faults:
        s = r.get("planted_score")
        lines.append(f"| {r['model']} | {r['tag']} | {r['planted']['op']} in {r['planted']['module']} ({r['planted']['phase']}) "
                     f"| {'n/a' if s is None else f'{s:.3g}'} | {'yes' if r['found'] else '**no**: ' + str(r['root_cause'])[:120]} |")
    sc = [r["planted_score"] for r in faults if r.get("planted_score") is not None and "x1.05" in r["tag"]]
    if sc:
        lines += ["", f"x1.05 faults: lowest score {min(sc):.3g}, median {float(np.median(sc)):.3g}; "
                  f"found {sum(r['found'] for r in faults if 'x1.05' in r['tag'])}/{sum('x1.05' in r['tag'] for r in faults)}; "
                  f"x2 found {sum(r['found'] for r in faults if 'x2' in r['tag'])}/{sum('x2' in r['tag'] for r in faults)}; "
                  f"clean runs with a root cause: {sum(bool(r['root_cause']) for r in clean)}/{len(clean)}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/torchparity-calib", help="where the dumps are kept")
    ap.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    ap.add_argument("--levels", default="aten", help="comma-separated dump levels (aten, api)")
    ap.add_argument("--no-dump", action="store_true", help="score existing dumps only")
    ap.add_argument("--redump", action="store_true", help="redo the dumps")
    ap.add_argument("--out", default="", help="write the Markdown tables here")
    ap.add_argument("--json", default="", help="write the raw results here")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from torchparity.compare.rootcause import DEFAULT_THRESHOLD
    from zoo_models import ZOO

    torch.set_num_threads(1)
    work = Path(a.work)
    models = [m for m in a.models.split(",") if m] or list(ZOO)
    levels = [x for x in a.levels.split(",") if x]
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    for m in models:
        if not a.no_dump:
            dump_model(m, work, levels, a.redump)
        results += score_model(m, work, levels)
        print(f"{m}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    md = (f"Command: `python bench/calibrate_judge.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
          f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores, "
          f"torch {torch.__version__}, {time.perf_counter() - t0:.0f} s\n\n" + table(results, DEFAULT_THRESHOLD))
    if a.out:
        Path(a.out).write_text(md)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
