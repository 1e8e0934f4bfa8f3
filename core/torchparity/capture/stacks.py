"""Cheap, deduplicated Python call stacks for records."""

from __future__ import annotations

import os
import sys
from typing import Callable

def _package_dir(name: str) -> str:
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    return os.path.dirname(path) + os.sep if path else "\0never\0"


#: frames from these places are not the user's code
_SKIP_PARTS = (
    _package_dir("torch"),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # torchparity itself
    "<frozen ",
    os.sep + "contextlib.py",
    os.sep + "threading.py",
)


#: file name -> whether its frames are left out (asked for every frame of every recorded call)
_SKIPPED: dict[str, bool] = {}


def _skipped(fn: str) -> bool:
    skip = _SKIPPED[fn] = any(p in fn for p in _SKIP_PARTS)
    return skip


class StackTable:
    """Interns call stacks: the same stack gets the same id; new stacks go to ``on_new``."""

    def __init__(self, on_new: Callable[[int, list[str]], None], depth: int = 12) -> None:
        self._ids: dict[tuple, int] = {}
        self._on_new = on_new
        self._depth = depth

    def current(self) -> int | None:
        frame = sys._getframe(2)
        key: list[tuple[str, int, str]] = []
        depth, skipped = self._depth, _SKIPPED
        while frame is not None and len(key) < depth:
            code = frame.f_code
            fn = code.co_filename
            skip = skipped.get(fn)
            if not (skip if skip is not None else _skipped(fn)):
                key.append((fn, frame.f_lineno, code.co_name))
            frame = frame.f_back
        if not key:
            return None
        tkey = tuple(key)
        sid = self._ids.get(tkey)
        if sid is None:
            sid = len(self._ids)
            self._ids[tkey] = sid
            self._on_new(sid, [f"{fn}:{line} in {name}" for fn, line, name in key])
        return sid

    def reset(self) -> None:
        self._ids.clear()
