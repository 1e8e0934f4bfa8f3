"""Long fuzz run: the engine of tests/fuzz/test_fuzz_readers.py over many cases per reader.

Counts per reader: cases, tracebacks, false passes, hangs (a case over --case-timeout s), seconds.

    .venv/bin/python bench/bench_fuzz.py [--examples 2000] [--out bench/results/fuzz.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path


def _engine():
    path = Path(__file__).resolve().parents[1] / "tests" / "fuzz" / "test_fuzz_readers.py"
    spec = importlib.util.spec_from_file_location("fuzz_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=2000, help="cases per reader test")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz.md"))
    a = ap.parse_args()
    os.environ["TORCHPARITY_FUZZ_EXAMPLES"] = str(a.examples)
    import pytest

    t0 = time.perf_counter()
    rc = pytest.main([str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"), "-q", "-p", "no:cacheprovider"])
    line = f"fuzz: {a.examples} cases per reader test, exit {rc}, {time.perf_counter() - t0:.0f} s"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(line + "\n")
    print(line)
    sys.exit(int(rc))


if __name__ == "__main__":
    main()
