"""Putting a capture mode back on a mode stack (dispatch or torch-function) under the modes the
user entered while it was off, and taking it off from under them.

Modes above it are taken off and pushed back with the stack's own functions (their
``__enter__``/``__exit__`` never run), so each user ``with`` still unwinds its own mode from the
top. Shared by the op stream's dispatch mode and the api level's function mode, which both leave
their stacks between a scheduled dump's full steps.
"""

from __future__ import annotations

from typing import Any, Callable


def insert_back(mode: Any, now: list[Any], left: list[Any], pop: Callable[[], Any],
                push: Callable[[Any], None], stays_below: Callable[[Any], bool] = lambda m: False) -> None:
    """Push ``mode`` onto the stack ``now`` (bottom first) just above the part it left
    (``left``, the stack when it left) that is still there, and above any mode for which
    ``stays_below`` is true that follows it (torch's default-device mode keeps the bottom)."""
    keep = 0
    while keep < min(len(now), len(left)) and now[keep] is left[keep]:
        keep += 1
    while keep < len(now) and stays_below(now[keep]):
        keep += 1
    above = [pop() for _ in range(len(now) - keep)]  # top first
    push(mode)
    for m in reversed(above):
        push(m)


def take_out(mode: Any, now: list[Any], pop: Callable[[], Any], push: Callable[[Any], None]) -> bool:
    """Take ``mode`` off the stack ``now`` (bottom first) from wherever it is (its topmost
    copy); False if it is not on it."""
    if not any(m is mode for m in now):
        return False
    above = []
    while now.pop() is not mode:
        above.append(pop())
    pop()
    for m in reversed(above):
        push(m)
    return True
