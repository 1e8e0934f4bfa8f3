"""Time ``torchparity compact`` and the five documented queries (docs/query.md) over a dump.

    python bench/synth_job.py /tmp/job --ranks 64 --records 50000 --steps 3 --plant-rank 37 --plant-step 2
    python bench/bench_query.py /tmp/job/dev            # compacts first when the dump has no summaries
    python bench/bench_query.py DIR --recompact         # time compact again (rewrites every summary)

Target: each query under 2 s over the 64-rank dump.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", type=Path)
    ap.add_argument("--recompact", action="store_true", help="rewrite the summaries (times compact)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each query (the best is reported)")
    a = ap.parse_args(argv)
    from torchparity.dump.compact import compact
    from torchparity.dump.query import EXAMPLE_QUERIES, connect

    rep = compact(a.dump, force=a.recompact)
    if rep.written:
        print(f"compact: {len(rep.written)} step/rank(s), {rep.records} records in {rep.seconds:.2f} s "
              f"({rep.records / rep.seconds:,.0f} records/s)")
    else:
        print(f"compact: {len(rep.up_to_date)} step/rank(s) already up to date ({rep.seconds:.2f} s to check)")
    worst = 0.0
    for name, sql in EXAMPLE_QUERIES.items():
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            con = connect(a.dump)  # the views are part of what `torchparity query` pays
            rows = len(con.execute(sql).df())
            con.close()
            best = min(best, time.perf_counter() - t0)
        worst = max(worst, best)
        print(f"{best:7.3f} s  {rows:4d} row(s)  {name}")
    print(f"slowest query: {worst:.3f} s (target < 2 s)")
    return 0 if worst < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
