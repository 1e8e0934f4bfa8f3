"""Run a change of the mode stacks outside a backward pass.

A training step can begin inside backward: an optimizer stepped from a gradient hook (PyTorch's
"optimizer step in backward" pattern, ``_apply_optimizer_in_backward``, ZeRO overlapping with
DDP) ends the step there. The autograd engine runs a backward with a copy of the caller's mode
stacks and puts the caller's back when it returns, so a mode pushed or popped inside it is lost.
The capture modes (the op stream's dispatch mode, the api level's function mode) leave or rejoin
their stacks between a scheduled dump's full steps only through :class:`OutsideBackward`: at once
outside backward, else at the first module entry after it. Mode stacks are per thread: a change
runs on the thread that started the capture (whose stacks hold its modes), never on another one
(an evaluation thread calling a module, a CUDA backward's device thread).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .module_tracker import ModuleTracker, in_backward


class OutsideBackward:
    """A queue of calls that must not run inside a backward pass, drained at module entries."""

    def __init__(self, tracker: ModuleTracker) -> None:
        self.tracker = tracker
        self._queue: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._owner = threading.get_ident()  # the thread whose stacks hold the capture's modes

    def _here(self) -> bool:
        """On the capture's thread, outside any backward pass?"""
        return threading.get_ident() == self._owner and not in_backward()

    def run(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` now, or, inside a backward pass or on another thread, at the first module
        entry on the capture's thread outside one (once, however often it is asked for meanwhile)."""
        if self._here():
            fn()
            return
        with self._lock:
            if fn not in self._queue:
                self._queue.append(fn)
        if self._drain not in self.tracker.on_enter:
            self.tracker.on_enter.append(self._drain)  # stays: one check per module entry

    def cancel(self, fn: Callable[[], None]) -> None:
        """Forget ``fn`` if it still waits (its mode is leaving)."""
        with self._lock:
            if fn in self._queue:
                self._queue.remove(fn)

    def close(self) -> None:
        """Forget every waiting call and leave the tracker's module entries (its owner is leaving;
        a tracker that outlives it keeps no hook of it)."""
        with self._lock:
            self._queue = []
        if self._drain in self.tracker.on_enter:
            self.tracker.on_enter.remove(self._drain)

    def _drain(self, frame: Any, args: tuple, kwargs: dict) -> None:
        """Run the queued changes (every one of them: a change that raises does not drop the
        ones after it; the first error is raised once all have run)."""
        if self._queue and self._here():
            with self._lock:
                fns, self._queue = self._queue, []
            error: BaseException | None = None
            for fn in fns:
                try:
                    fn()
                except BaseException as exc:  # noqa: BLE001 - re-raised below, after the rest ran
                    if error is None:
                        error = exc
            if error is not None:
                raise error
        return None
