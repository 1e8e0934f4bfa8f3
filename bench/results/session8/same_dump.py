"""Check that two torchparity source trees write the same dump of the launch-bound bench model.

Usage (from a worktree, its venv active)::

    python bench/results/session8/same_dump.py BEFORE_CORE_DIR AFTER_CORE_DIR [STEPS]

Each tree (its ``core`` directory first on ``sys.path``) dumps 3 steps of ``bench_launch``'s HF
Llama (same seeds) at aten level, statistics mode, Parquet summaries on, in a fresh process.
Then: every ``records.jsonl`` must be byte-identical (statistics written as shortest round-trip
floats: identical text is bitwise-equal values); ``stacks.jsonl``/``modules.jsonl`` identical;
``header.json``/``footer.json`` equal except timing/pid/host fields and the dump's own path; every summary Parquet table
equal (``Table.equals``, schema metadata aside: it names the file's fingerprint). The trained
parameters must also be bitwise equal to a run without the tool (numerics unchanged).
Exit 0 when all hold; else one line per difference and exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = r'''
import sys, torch
sys.path.insert(0, {core!r}); sys.path.insert(0, {bench!r})
torch.set_num_threads(1)
from bench_launch import LlamaBench
import torchparity
b = LlamaBench("launch")
if {dump!r}:
    tool = torchparity.dump({out!r}, level="aten", mode="statistics", model=b.model, summaries="step")
    tool.start()
for _ in range({steps}):
    b.step()
if {dump!r}:
    tool.stop()
torch.save({{k: v.detach().clone() for k, v in b.model.state_dict().items()}}, {out!r} + ".params.pt")
'''

_VOLATILE = {"time", "started", "finished", "pid", "host", "hostname", "elapsed", "wall", "duration", "created",
             "date", "python", "argv", "cwd", "path", "started_at", "ended_at", "written_at", "seconds"}


def _run(core: str, out: str, steps: int, dump: bool) -> None:
    bench = str(Path(__file__).resolve().parents[2])
    code = _RUN.format(core=core, bench=bench, out=out, steps=steps, dump=dump)
    subprocess.run([sys.executable, "-c", code], check=True)


def _strip(d: object) -> object:
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in _VOLATILE}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def main() -> int:
    before, after = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    tmp = Path(tempfile.mkdtemp())
    a, b, off = str(tmp / "before"), str(tmp / "after"), str(tmp / "off")
    _run(before, a, steps, True)
    _run(after, b, steps, True)
    _run(after, off, steps, False)
    problems: list[str] = []
    files_a = sorted(p.relative_to(a) for p in Path(a).rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in Path(b).rglob("*") if p.is_file())
    if files_a != files_b:
        problems.append(f"file lists differ: {sorted(set(map(str, files_a)) ^ set(map(str, files_b)))}")
    n_records = 0
    for rel in files_a:
        pa_, pb_ = Path(a) / rel, Path(b) / rel
        if not pb_.exists():
            continue
        if rel.suffix == ".jsonl":
            if pa_.read_bytes() != pb_.read_bytes():
                problems.append(f"{rel} differs")
            elif rel.name == "records.jsonl":
                n_records += pa_.read_bytes().count(b"\n")
        elif rel.suffix == ".json":
            if _strip(json.loads(pa_.read_text())) != _strip(json.loads(pb_.read_text())):
                problems.append(f"{rel} differs (timing/pid fields aside)")
        elif rel.suffix == ".parquet":
            import pyarrow.parquet as pq

            ta, tb = pq.read_table(pa_), pq.read_table(pb_)
            if not ta.replace_schema_metadata(None).equals(tb.replace_schema_metadata(None)):
                problems.append(f"{rel} differs")
    import torch

    pa_params, po = torch.load(a + ".params.pt", weights_only=True), torch.load(off + ".params.pt", weights_only=True)
    pb_params = torch.load(b + ".params.pt", weights_only=True)
    for k in po:
        if not (torch.equal(po[k], pb_params[k]) and torch.equal(po[k], pa_params[k])):
            problems.append(f"parameter {k}: tool on != tool off")
    for p in problems:
        print(p)
    print(f"{len(files_a)} files, {n_records} records compared: "
          f"{'IDENTICAL' if not problems else f'{len(problems)} difference(s)'}; numerics tool on == off: "
          f"{'yes' if not any('parameter' in p for p in problems) else 'NO'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
