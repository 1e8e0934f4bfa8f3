"""Which rank this process is, and whether the run is distributed (read at any time, also
before ``init_process_group``: torchrun's environment variables count)."""

from __future__ import annotations

import os


def _distributed() -> bool:
    """A distributed run, or one about to be (under torchrun, before init_process_group)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return True
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except Exception:  # pragma: no cover
        return False


def current_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # pragma: no cover
        pass
    return int(os.environ.get("RANK", "0") or 0)


def world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:  # pragma: no cover
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1)
