"""The unit a bisect promotes and reports: an op call named by its module and record name."""

from __future__ import annotations

from typing import Callable

from ..capture.op_stream import OpCall

#: one unit of promotion: (module path, the dump's record name "Aten._softmax.3.forward"): the
#: same call of every step (call indices restart at every step)
OpKey = tuple[str, str]
Predicate = Callable[[OpCall], bool]


def op_key(call: OpCall) -> OpKey:
    """The op unit of a call: its module and record name (``op.phase`` for uncounted ops)."""
    return (call.module, call.name or f"{call.info.op}.{call.phase}")


def describe_op(key: OpKey) -> str:
    """``layers.0.attn: Aten._softmax.0.forward``."""
    module, name = key
    return f"{module or '(top level)'}: {name}"
