"""The dump option ``replica_check=True``: record each parameter's gradient hash (after the
all-reduce, at ``optimizer.step()``) and parameter hash (after the step) in the dump, so that
``torchparity replicas DIR`` can check the data-parallel replicas offline.

Layout (next to the step directories; one file per rank, one line per step and optimizer)::

    DIR/replicas/rank{R}.jsonl
    {"step": 0, "rank": 1, "world_size": 4, "algorithm": "tp-bits64-v1", "optimizer": 0,
     "names": ["fc1.weight", ...], "grad": ["3f1c...", null, ...], "param": ["9a07...", ...]}

``grad`` holds ``null`` for a parameter without a gradient. No collective runs: each rank
writes its own hashes (one host copy of ``2 x 2P`` integers per step); the offline command
votes across the ranks' files. A rank's file is replaced when a new run dumps that rank into the
same directory (like its step directories).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..capture.compiled import eager_hook
from ..capture.tool_state import tool_work
from .hashing import ALGORITHM, hex64, stacked_hashes
from .online import optimizer_params, param_names

log = logging.getLogger("torchparity")
SUBDIR = "replicas"
_OPENED: set[tuple[str, int]] = set()  # (dump root, rank) files opened by this process: append


def replica_file(root: str | os.PathLike[str], rank: int) -> Path:
    """``DIR/replicas/rank{R}.jsonl``."""
    return Path(root) / SUBDIR / f"rank{int(rank)}.jsonl"


class ReplicaRecorder:
    """Global optimizer hooks that append one line of hashes per step (see the module doc).

    :param root: the dump directory; :param rank: this process's rank.
    :param model: names the parameters (else ``param[i]``, the optimizer's order).
    :param current_step: the dump's current step (read at ``optimizer.step()``'s start).
    :param wanted: ``step -> bool``, whether the dump captures that step.
    """

    def __init__(self, root: str | os.PathLike[str], rank: int, model: torch.nn.Module | None,
                 current_step: Callable[[], int], wanted: Callable[[int], bool] = lambda s: True,
                 fsync: bool = False) -> None:
        self.path = replica_file(root, rank)
        self.rank = rank
        self.model = model
        self.current_step = current_step
        self.wanted = wanted
        self.fsync = fsync
        self._handles: list[Any] = []
        self._optimizers: dict[int, int] = {}  # id(optimizer) -> index (several optimizers)
        self._pending: dict[int, tuple[int, torch.Tensor]] = {}  # id(optimizer) -> (step, grad hashes)
        self._file: Any = None
        self.error: str | None = None
        from ..capture.ranks import world_size

        self.world_size = world_size()

    def __enter__(self) -> "ReplicaRecorder":
        import torch.optim.optimizer as optim_mod

        key = (str(self.path.resolve()), self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab" if key in _OPENED else "wb", buffering=0)
        _OPENED.add(key)
        self._handles = [optim_mod.register_optimizer_step_pre_hook(eager_hook(self._pre)),
                         optim_mod.register_optimizer_step_post_hook(eager_hook(self._post))]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._file is not None:
            self._file.close()
            self._file = None

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        step = self.current_step()
        if self.error is None and self.wanted(step):
            params = optimizer_params(optimizer)
            with tool_work():  # the tool's own ops: the dump does not record them
                self._pending[id(optimizer)] = (step, stacked_hashes([p.grad for p in params]))

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pending = self._pending.pop(id(optimizer), None)
        if pending is None or self._file is None:
            return
        step, grads = pending
        params = optimizer_params(optimizer)
        index = self._optimizers.setdefault(id(optimizer), len(self._optimizers))
        with tool_work():
            both = torch.cat([grads.to(torch.device("cpu")), stacked_hashes(params).to(torch.device("cpu"))], dim=1)
            rows = both.tolist()
        P = len(params)
        line = {"step": step, "rank": self.rank, "world_size": self.world_size, "algorithm": ALGORITHM, "optimizer": index,
                "names": param_names(self.model, params),
                "grad": [hex64(h) if present else None for h, present in zip(rows[0][:P], rows[1][:P])],
                "param": [hex64(h) if present else None for h, present in zip(rows[0][P:], rows[1][P:])]}
        try:
            self._file.write((json.dumps(line) + "\n").encode())
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:  # never stops the training; told once
            self.error = " ".join(str(exc.strerror or exc).split())
            log.warning("torchparity: replica hashes are no longer written to %s (%s)", self.path, self.error)
