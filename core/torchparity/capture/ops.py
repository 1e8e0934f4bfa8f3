"""What an op is, from PyTorch's own op metadata rather than hand-written lists.

Used by the dump (flags), online compare (what can be re-run) and the NaN/Inf tracker.
"""

from __future__ import annotations

from typing import Any

import torch

COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor"})
#: the arguments ``c10d`` ops write into (their schemas carry no alias annotation: ``allreduce_``
#: reduces ``tensors`` in place, ``recv_`` fills them, ``_allgather_base_`` fills ``output_tensor``)
C10D_WRITTEN_ARGS = frozenset({"tensors", "output_tensors", "output_tensor", "output", "outputs", "output_lists"})
#: ``c10d`` ops whose ``tensors`` are only read
C10D_READ_ONLY = frozenset({"send", "barrier", "monitored_barrier_", "check_for_nan"})
#: ops whose result is uninitialised memory or pure metadata: never judged numerically
UNINITIALISED_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"})
#: outputs that are a fused kernel's opaque scratch memory (workspace / reserve space), by op:
#: their bytes are not a result (uninitialised padding, layout private to the kernel and its
#: dtype), so they are described, never measured, compared or re-computed
WORKSPACE_OUTPUTS: dict[str, frozenset[int]] = {
    "mkldnn_rnn_layer": frozenset({3}), "_cudnn_rnn": frozenset({3}), "miopen_rnn": frozenset({3}),
    "cudnn_batch_norm": frozenset({3}), "_batch_norm_with_update": frozenset({3}),
    "_batch_norm_no_update": frozenset({3}), "_batch_norm_impl_index": frozenset({3}),
}
#: argument names (from the op schemas) of such a workspace handed back to the backward kernel
WORKSPACE_ARGS = frozenset({"workspace", "reserve", "reserveSpace", "reservedSpace", "reserve_space"})
#: schema result names that are scratch too (flash attention's ``unused``)
_WORKSPACE_RESULT_NAMES = frozenset({"unused"})
#: ops whose *indices* depend on ties: compare values only
TIE_SENSITIVE_OPS = frozenset({"sort", "topk", "argmax", "argmin", "argsort", "max", "min", "kthvalue", "mode", "median", "nanmedian", "unique", "_unique2", "unique_consecutive", "msort", "cummax", "cummin"})


def namespace(func: Any) -> str:
    return getattr(func, "namespace", "") or ""


def base_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(func, "__name__", str(func))


def is_collective(func: Any) -> bool:
    return namespace(func) in COLLECTIVE_NAMESPACES


def is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False))


def is_random(func: Any) -> bool:
    tags = getattr(func, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def is_inplace(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return bool(schema.is_mutable)
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name.startswith("__i")


def written_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, is a tensor list) of the arguments the op writes into, from its schema's
    alias info. Single-tensor writes get their version counter bumped by autograd's
    ADInplaceOrView kernel after the op returns; tensor-list writes (``_foreach_*_``) do not."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    out = []
    c10d = namespace(func) == "c10d" and base_name(func) not in C10D_READ_ONLY
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is not None and info.is_write or c10d and a.name in C10D_WRITTEN_ARGS:
            out.append((i, a.name, isinstance(a.type, torch.ListType)))
    return tuple(out)


def is_uninitialised(func: Any) -> bool:
    return base_name(func) in UNINITIALISED_OPS


def is_tie_sensitive(func: Any) -> bool:
    return base_name(func) in TIE_SENSITIVE_OPS


def workspace_outputs(func: Any) -> frozenset[int]:
    """Indices of the op's results that are opaque workspace memory (see :data:`WORKSPACE_OUTPUTS`)."""
    found = set(WORKSPACE_OUTPUTS.get(base_name(func), ()))
    schema = getattr(func, "_schema", None)
    if schema is not None:
        found.update(i for i, r in enumerate(schema.returns) if r.name in _WORKSPACE_RESULT_NAMES)
    return frozenset(found)


def workspace_inputs(func: Any) -> frozenset[str]:
    """Argument keys (position as a string, and name) of the workspace inputs the op consumes
    (``mkldnn_rnn_layer_backward``'s ``workspace``, ``_cudnn_rnn_backward``'s ``reserve``...)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return frozenset()
    keys: set[str] = set()
    for i, a in enumerate(schema.arguments):
        if a.name in WORKSPACE_ARGS:
            keys.update((str(i), a.name))
    return frozenset(keys)


def storage_ptr(t: Any) -> int:
    """The address of ``t``'s storage, or 0 for a tensor without one (subclasses, meta, functional
    tensors): a key for "the same memory" that never raises."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0
