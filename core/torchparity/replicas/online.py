"""``torchparity.ReplicaCheck``: every data-parallel replica must hold the same gradients after
the all-reduce and the same parameters after the optimizer step; name the rank that does not.

No reference run is needed (Megatron-LM's replica check): the ranks of a data-parallel group
check each other. Per optimizer step, on every rank:

* an optimizer step **pre**-hook fingerprints each parameter's gradient (under DDP the
  all-reduce has finished when ``optimizer.step()`` is called, so every replica must hold the
  same bits);
* a step **post**-hook fingerprints each parameter, stacks both into one small int64 tensor
  ``(2, 2P)`` (hashes and presence flags) and runs **one** ``all_gather`` of the data-parallel
  group; the hashes are computed on the device (:mod:`.hashing`), only the gathered
  ``W x 2 x 2P`` integers come to the host.

A quantity whose ranks disagree is voted on (:mod:`.vote`): the rank outside the majority is
named, with the step and the parameter; without a majority the finding says so. Findings are
logged (WARNING), written to ``output_dir/replica_check.json`` by the group's first rank, and
raise :class:`ReplicaMismatchError` with ``on_mismatch="raise"``. A clean run logs one INFO line
every ``log_every`` steps.

The check reads tensors and never writes them: the training's numerics are untouched.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..capture.compiled import eager_hook
from ..capture.tool_state import tool_work
from ..errors import TorchparityError, UsageError
from .hashing import ALGORITHM, hex64, stacked_hashes
from .vote import ReplicaFinding, vote

log = logging.getLogger("torchparity")
ON_MISMATCH = ("log", "raise")
#: findings kept in memory and in the JSON file (a rank that stays wrong would add P per step)
MAX_FINDINGS = 1000
#: findings logged one per line in one step; the rest are counted
MAX_LOGGED = 5


class ReplicaMismatchError(TorchparityError):
    """Raised by :class:`ReplicaCheck` (``on_mismatch="raise"``) when replicas disagree."""

    exit_code = 1

    def __init__(self, message: str, findings: list[ReplicaFinding]) -> None:
        super().__init__(message)
        self.findings = findings


def param_names(model: torch.nn.Module | None, params: list[torch.Tensor]) -> list[str]:
    """Names for ``params`` from ``model`` (a DDP/FSDP wrapper's ``module.`` prefix removed);
    a parameter the model does not hold is named by its optimizer position."""
    names: dict[int, str] = {}
    if model is not None:
        inner = getattr(model, "module", model) if isinstance(getattr(model, "module", None), torch.nn.Module) else model
        for n, p in inner.named_parameters(remove_duplicate=True):
            names.setdefault(id(p), n)
    return [names.get(id(p), f"param[{i}]") for i, p in enumerate(params)]


def optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    """The optimizer's parameters in param-group order, each once."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class ReplicaCheck:
    """Check that data-parallel replicas agree, every optimizer step (see the module doc).

    ::

        model = DDP(model)
        with torchparity.ReplicaCheck(model, optimizer, output_dir="replicas"):
            for batch in loader:
                loss = model(batch).sum(); loss.backward(); optimizer.step(); optimizer.zero_grad()

    :param model: the model (a DDP wrapper is fine): names the parameters.
    :param optimizer: the optimizer whose ``step()`` ends a check; its parameters are checked.
    :param group: the data-parallel process group (default: the world). Under FSDP/HSDP pass the
        replicate group: fully sharded parameters are no replicas of each other.
    :param output_dir: directory for ``replica_check.json`` (written by the group's first rank
        when replicas disagree, and when the check stops).
    :param on_mismatch: ``"log"`` (default) or ``"raise"`` (:class:`ReplicaMismatchError` on
        every rank, at the step whose replicas disagree).
    :param log_every: a clean run logs one INFO line per this many steps.
    :param grads: check gradients after the all-reduce; :param params: parameters after the step.
    """

    def __init__(self, model: torch.nn.Module | None, optimizer: Any, *, group: Any = None,
                 output_dir: str | os.PathLike[str] | None = None, on_mismatch: str = "log",
                 log_every: int = 100, grads: bool = True, params: bool = True) -> None:
        if on_mismatch not in ON_MISMATCH:
            raise UsageError(f"ReplicaCheck on_mismatch must be one of {', '.join(ON_MISMATCH)} (got {on_mismatch!r})")
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise UsageError(f"ReplicaCheck log_every must be a whole number >= 1 (got {log_every!r})")
        if not hasattr(optimizer, "register_step_pre_hook"):
            raise UsageError("ReplicaCheck needs a torch.optim.Optimizer (with step hooks, torch >= 2.0); "
                             f"got {type(optimizer).__name__}")
        if not (grads or params):
            raise UsageError("ReplicaCheck: grads and params are both off; nothing would be checked")
        self.model = model
        self.optimizer = optimizer
        self.group = group
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.on_mismatch = on_mismatch
        self.log_every = log_every
        self.check_grads = grads
        self.check_params = params
        self.step = 0  # optimizer steps seen (the dump's step numbering: the first step is 0)
        self.steps_checked = 0
        self.gathers = 0  # collectives run (one per checked step)
        self.findings: list[ReplicaFinding] = []
        self.dropped_findings = 0
        self._handles: list[Any] = []
        self._grad_hashes: torch.Tensor | None = None
        self._params: list[torch.Tensor] = []
        self._names: list[str] = []
        self._ranks: list[int] = [0]
        self._me = 0
        self._bad_since: dict[tuple[str, str, int], int] = {}
        self._clean_from = 0

    # ---- lifecycle -------------------------------------------------------------------------
    def attach(self) -> "ReplicaCheck":
        """Install the optimizer hooks (also done by ``with``)."""
        if self._handles:
            return self
        self._params = optimizer_params(self.optimizer)
        self._names = param_names(self.model, self._params)
        self._ranks, self._me = _group_ranks(self.group)
        if len(self._ranks) < 2:
            log.warning("torchparity: ReplicaCheck: the data-parallel group has %d rank(s); there is no replica "
                        "to compare with (run under torchrun with several ranks)", len(self._ranks))
            return self
        if self.output_dir is not None and self._me == 0:
            from ..capture.options import check_output_dir

            check_output_dir(self.output_dir, "ReplicaCheck output_dir")
        self._handles = [self.optimizer.register_step_pre_hook(eager_hook(self._pre)),
                         self.optimizer.register_step_post_hook(eager_hook(self._post))]
        return self

    def detach(self) -> None:
        """Remove the hooks; the group's first rank writes the final ``replica_check.json``."""
        for h in self._handles:
            h.remove()
        if self._handles:
            self._write()
            if not self.findings and self.steps_checked:
                log.info("torchparity: replica check: %d step(s), %d parameter(s) agree on %d ranks",
                         self.steps_checked, len(self._params), len(self._ranks))
        self._handles = []

    def __enter__(self) -> "ReplicaCheck":
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    # ---- hooks -------------------------------------------------------------------------------
    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.check_grads:
            with tool_work():  # the tool's own ops: a running dump does not record them
                self._grad_hashes = stacked_hashes([p.grad for p in self._params])

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        step = self.step
        self.step += 1
        parts = []
        if self.check_grads and self._grad_hashes is not None:
            parts.append(self._grad_hashes)
        self._grad_hashes = None
        if not (parts or self.check_params):
            return
        with tool_work():
            if self.check_params:
                parts.append(stacked_hashes(self._params))
            local = torch.cat([p.to(_comm_device(self.group, parts[0].device)) for p in parts], dim=1)
            gathered = self._all_gather(local).tolist()
        self.steps_checked += 1
        self._judge(step, gathered)

    def _all_gather(self, local: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        out = [torch.empty_like(local) for _ in self._ranks]
        dist.all_gather(out, local, group=self.group)
        self.gathers += 1
        return torch.stack(out)

    # ---- judging -----------------------------------------------------------------------------
    def _judge(self, step: int, gathered: list[list[list[int]]]) -> None:
        """``gathered[rank_index] = [hashes, present]``, grads first (when checked), then params."""
        kinds = (["grad"] if self.check_grads else []) + (["param"] if self.check_params else [])
        P = len(self._params)
        new: list[ReplicaFinding] = []
        for k, kind in enumerate(kinds):
            for i, name in enumerate(self._names):
                col = k * P + i
                values = {}
                for ri, rank in enumerate(self._ranks):
                    h, present = gathered[ri][0][col], gathered[ri][1][col]
                    values[rank] = hex64(h) if present else None
                if kind == "grad" and all(v is None for v in values.values()):
                    continue  # a frozen parameter: no gradient anywhere
                f = vote(step, kind, name, values)
                if f is None:
                    for r in self._ranks:
                        self._bad_since.pop((kind, name, r), None)
                    continue
                for r in f.ranks:
                    f.since = min(f.since if f.since is not None else step,
                                  self._bad_since.setdefault((kind, name, r), step))
                new.append(f)
        if new:
            self._report(step, new)
        elif self.steps_checked % self.log_every == 0:
            log.info("torchparity: replica check: steps %d..%d: %d parameter(s) agree on %d ranks",
                     self._clean_from, step, P, len(self._ranks))
            self._clean_from = step + 1

    def _report(self, step: int, new: list[ReplicaFinding]) -> None:
        fresh = [f for f in new if f.since is None or f.since == step]
        shown = fresh or new
        for f in shown[:MAX_LOGGED]:
            log.warning("torchparity: replica check: %s", f.describe())
        if len(new) > len(shown[:MAX_LOGGED]):
            log.warning("torchparity: replica check: step %d: %d replica mismatch(es) in all (%d new)",
                        step, len(new), len(fresh))
        room = MAX_FINDINGS - len(self.findings)
        self.findings.extend(new[:max(room, 0)])
        self.dropped_findings += max(len(new) - max(room, 0), 0)
        self._write()
        self._clean_from = step + 1
        if self.on_mismatch == "raise":
            raise ReplicaMismatchError(f"replica check: {shown[0].describe()}", new)

    @property
    def first(self) -> ReplicaFinding | None:
        """The first finding (earliest step; gradients before parameters), or None."""
        return self.findings[0] if self.findings else None

    def summary(self) -> dict[str, Any]:
        """What ``replica_check.json`` holds."""
        return {"algorithm": ALGORITHM, "group_ranks": self._ranks, "params": len(self._params),
                "steps_checked": self.steps_checked, "gathers": self.gathers,
                "checks": [k for k, on in (("grad", self.check_grads), ("param", self.check_params)) if on],
                "agree": not self.findings, "first": self.first.to_json() if self.first else None,
                "findings": [f.to_json() for f in self.findings], "dropped_findings": self.dropped_findings}

    def _write(self) -> None:
        if self.output_dir is None or self._me != 0:
            return
        path = self.output_dir / "replica_check.json"
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.summary(), indent=1), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:  # the check must never stop training
            log.warning("torchparity: replica check: cannot write %s (%s)", path, exc.strerror or exc)


def _group_ranks(group: Any) -> tuple[list[int], int]:
    """(global ranks of ``group``, this process's index in it); ``([0], 0)`` without distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [0], 0
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    if group is None or group is dist.group.WORLD:
        return list(range(size)), me
    getter = getattr(dist, "get_process_group_ranks", None)
    ranks = list(getter(group)) if getter is not None else list(range(size))
    return ranks, me


def _comm_device(group: Any, device: torch.device) -> torch.device:
    """Where the gathered tensor must live for the group's backend (gloo: the CPU)."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(group))
    except Exception:
        return device
    if backend == "gloo" or device.type == "cpu":
        return torch.device("cpu")
    return device
