"""Keep Python's cyclic garbage collector off the process's old heap while a tool captures.

A capture allocates a few container objects per recorded op (records, tensor entries, statistics
rows) that live until the writer thread has written them. Enough of them survive two young
collections to trigger CPython's full collections, and a full collection walks every object the
process holds: with torch and transformers imported that is ~400 000 objects, ~140 ms each on the
2-core VM. Measured on the launch-bound bench (bench/bench_launch.py, dump aten + statistics),
the collector took ~20 ms of each ~75 ms step.

:func:`hold` calls :func:`gc.freeze` when the first tool starts: every object alive then moves to
the collector's permanent generation, which its collections skip. It is not a change to what is
freed: reference counting frees everything as before; only reference *cycles* among objects that
were alive at the start and die during the capture wait until :func:`release` (the last tool's
stop) calls :func:`gc.unfreeze`, which hands them back to the oldest generation. When the process
had frozen objects of its own before (``gc.get_freeze_count() > 0``: a pre-fork server, say), the
heap is left frozen at the end, as the process had it. Nothing numeric depends on the collector.

``TORCHPARITY_GC_FREEZE=0`` in the environment turns it off.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0
_ours = False  # did our hold() freeze the heap (and so should release() unfreeze it)?


def enabled() -> bool:
    """Freezing is on unless ``TORCHPARITY_GC_FREEZE`` is ``0``/``false``/``no``/``off``."""
    return os.environ.get("TORCHPARITY_GC_FREEZE", "1").strip().lower() not in ("0", "false", "no", "off")


def hold() -> None:
    """A tool starts capturing: the first holder freezes the heap. Pair with :func:`release`."""
    global _holders, _ours
    with _lock:
        _holders += 1
        if _holders == 1:
            _ours = False
            if enabled() and hasattr(gc, "freeze"):
                _ours = gc.get_freeze_count() == 0
                gc.freeze()


def release() -> None:
    """A tool stops: the last holder unfreezes the heap (unless the process had frozen it itself)."""
    global _holders, _ours
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0 and _ours:
            _ours = False
            gc.unfreeze()


def holders() -> int:
    """How many tools hold the heap frozen now (tests)."""
    return _holders


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection for the duration (a few tens of milliseconds of bulk allocation on
    the writer thread, e.g. building a step's Parquet summaries: their young objects survive
    until the end anyway, and collecting them midway cost ~30 % of that work). A collector the
    process turned off stays off; ``TORCHPARITY_GC_FREEZE=0`` leaves the collector alone."""
    if not enabled() or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
