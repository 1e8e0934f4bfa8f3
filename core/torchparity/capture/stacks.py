"""Cheap, deduplicated Python call stacks for records."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

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
    """Interns call stacks: the same stack gets the same id; new stacks go to ``on_new``.

    The walk up the frames is keyed cheaply: by each kept frame's code object and last
    instruction (``f_lasti``), which the interpreter has at hand, instead of its file, line number
    (computed from the instruction on every access) and function name. Only a key not seen this
    step is spelled out as ``file:line in function`` and interned by that text, so two call sites
    on the same line still share one id, as before."""

    def __init__(self, on_new: Callable[[int, list[str]], None], depth: int = 12) -> None:
        self._ids: dict[tuple, int] = {}  # (file, line, function) per frame -> id (this step)
        # (code, lasti) per frame -> (file, line, function) per frame: kept across steps (the
        # spelling of a call site never changes), bounded
        self._spelled: dict[tuple, tuple] = {}
        self._on_new = on_new
        self._depth = depth

    def current(self) -> int | None:
        frame = sys._getframe(2)
        key: list = []
        depth, skipped = self._depth * 2, _SKIPPED_CODE
        while frame is not None and len(key) < depth:
            code = frame.f_code
            skip = skipped.get(code)
            if skip is None:
                skip = _skip_code(code)
            if not skip:
                key.append(code)
                key.append(frame.f_lasti)
            frame = frame.f_back
        if not key:
            return None
        fkey = tuple(key)
        tkey = self._spelled.get(fkey)
        if tkey is None:
            tkey = self._spell(fkey)
        sid = self._ids.get(tkey)
        if sid is None:
            sid = len(self._ids)
            self._ids[tkey] = sid
            self._on_new(sid, [f"{fn}:{line} in {name}" for fn, line, name in tkey])
        return sid

    def _spell(self, fkey: tuple) -> tuple:
        """(file, line, function) of each (code, lasti) frame of the key, remembered."""
        if len(self._spelled) > 100_000:
            self._spelled.clear()
        tkey = self._spelled[fkey] = tuple((fkey[i].co_filename, _line(fkey[i], fkey[i + 1]), fkey[i].co_name)
                                           for i in range(0, len(fkey), 2))
        return tkey

    def reset(self) -> None:
        """A new step: stack ids start again from 0 (each step's stacks are written with it)."""
        self._ids.clear()


#: code object -> whether its frames are left out (bounded: code made at run time is not kept forever)
_SKIPPED_CODE: dict[Any, bool] = {}


def _skip_code(code: Any) -> bool:
    if len(_SKIPPED_CODE) > 100_000:
        _SKIPPED_CODE.clear()
    fn = code.co_filename
    skip = _SKIPPED_CODE[code] = _SKIPPED.get(fn) or _skipped(fn)
    return skip


def _line(code: Any, lasti: int) -> int | None:
    """The line of the instruction at byte offset ``lasti`` (what ``frame.f_lineno`` says)."""
    line = None
    for start, end, ln in code.co_lines():
        if start <= lasti < end:
            return ln
        if start > lasti:
            break
        line = ln if ln is not None else line
    return line
