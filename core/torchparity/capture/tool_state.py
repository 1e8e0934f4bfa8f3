"""Is torchparity itself computing on this thread? (shared by every interceptor)."""

from __future__ import annotations

import threading
from typing import Any

_tool_state = threading.local()


def tool_is_busy() -> bool:
    """True while torchparity itself computes on this thread (statistics, checksums, reference
    ops). Interceptors pass such ops through untouched and unrecorded."""
    return getattr(_tool_state, "busy", 0) > 0


class tool_work:
    """Context manager marking the tool's own computation (see :func:`tool_is_busy`)."""

    def __enter__(self) -> None:
        _tool_state.busy = getattr(_tool_state, "busy", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _tool_state.busy -= 1
