"""``torchparity.watch``: the watchdog around a training loop (see docs/watch.md).

    with torchparity.watch(model, optimizer, output_dir="watch", every=10) as w:
        for batch in loader:
            loss = w.run(train_step, batch)   # train_step(batch) -> loss; it steps the optimizer
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from ..capture.compiled import eager_hook
from ..capture.tool_state import tool_work
from ..errors import TorchparityError, UsageError
from .confirm import confirm
from .options import WatchOptions
from .report import build_report, write_report
from .snapshots import History, StepRecord, capture_state, restore_state
from .triggers import CheapTier, Trigger, grad_norm

log = logging.getLogger("torchparity")


class WatchTriggered(TorchparityError):
    """Raised by :meth:`Watch.run` with ``on_trigger="raise"``; ``report`` is the watch report."""

    exit_code = 3

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        rc = report.get("root_cause") or {}
        where = f"{rc.get('name')} in {rc.get('module') or '-'} ({rc.get('phase')})" if rc.get("name") else "no culprit op found"
        super().__init__(f"watch: step {report['step']} on rank {report['rank']}: {report['trigger']['kind']}, "
                         f"{'reproducible' if report['reproducible'] else 'transient'}; {where}; see {report['path']}")


def _rank() -> tuple[int, int]:
    d = torch.distributed
    if d.is_available() and d.is_initialized():
        return d.get_rank(), d.get_world_size()
    return 0, 1


class Watch:
    """The watchdog (make it with :func:`watch`). ``step`` counts the steps run through
    :meth:`run`; ``triggers`` lists every :class:`Trigger`; ``reports`` the reports written."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, options: WatchOptions, scaler: Any = None) -> None:
        self.model, self.optimizer, self.scaler, self.options = model, optimizer, scaler, options
        self.tier = CheapTier(options.window, options.min_window, options.loss_spike, options.grad_spike,
                              scaler=scaler is not None)
        self.history = History(options.every, options.memory_budget, options.snapshot_share)
        self.step = 0
        self.triggers: list[Trigger] = []
        self.reports: list[dict[str, Any]] = []
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        self._norm: torch.Tensor | None = None
        self._hook: Any = None
        self._pending: tuple[StepRecord, torch.Tensor, Any] | None = None  # an asynchronous read (CUDA)
        self._replaying = False

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Watch":
        if self._hook is not None:
            raise UsageError("watch: this watch is already running; use one `with torchparity.watch(...)` block")
        try:
            self.options.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"watch: cannot create output_dir {self.options.output_dir} ({exc.strerror or exc})") from None
        if _rank()[1] > 1:  # every rank must replay the same steps: one fixed interval for all
            self.history.share = None
        self._hook = self.optimizer.register_step_pre_hook(eager_hook(self._pre_step))
        return self

    def stop(self) -> None:
        if self._hook is None:
            return
        try:
            self.history.settle()
            self._resolve()
        finally:
            self._hook.remove()
            self._hook = None

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.stop()
        elif self._hook is not None:
            try:  # the snapshot thread ends before the block does; the user's exception is the one raised
                self.history.settle()
            except Exception:  # noqa: BLE001
                pass
            self._hook.remove()
            self._hook = None

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, step_fn: Callable[[Any], Any], batch: Any) -> Any:
        """Run one training step, ``step_fn(batch)`` (forward, backward, optimizer step; it returns
        the loss), with the cheap tier on; on a trigger, confirm it (docs/watch.md) and act as
        ``on_trigger`` says. Returns what ``step_fn`` returned."""
        if self._hook is None:
            raise UsageError("watch.run: the watch is not running; call it inside `with torchparity.watch(...) as w:`")
        if not callable(step_fn):
            raise UsageError(f"watch.run: step_fn must be callable (got {type(step_fn).__name__})")
        self._resolve()
        self._step_fn = step_fn  # a replay re-runs the steps with it
        rec = self.history.begin_step(self.step, batch, self.model, self.optimizer, self.scaler)
        self._norm = None
        loss = step_fn(batch)
        self.history.settle()  # a step without an optimizer step (or a skipped one) did not settle it
        self.history.note_peak()
        vals = self._values(loss)
        self.step += 1
        if vals.device.type == "cuda":  # read at the next step, without waiting for the device now
            host = torch.empty(vals.shape, dtype=vals.dtype, pin_memory=True)
            host.copy_(vals, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._pending = (rec, host, ev)
        else:
            self._judge(rec, vals)
        return loss

    def _values(self, loss: Any) -> torch.Tensor:
        """``[loss, grad norm]`` as one small float32 tensor (the tool's own work: never seen by a
        dump, tracker or device running alongside)."""
        with tool_work(), torch.no_grad():
            return self._values_now(loss)

    def _values_now(self, loss: Any) -> torch.Tensor:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            lv = loss.detach().float().reshape(1)
        elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
            lv = torch.tensor([float(loss)])
        else:
            raise UsageError(f"watch.run: the step function must return the loss (a one-element tensor or a float), "
                             f"got {type(loss).__name__}")
        n = self._norm
        if n is None:
            return lv
        return torch.cat([lv, n.reshape(1).to(lv.device)])

    def _resolve(self) -> None:
        if self._pending is not None:
            rec, host, ev = self._pending
            self._pending = None
            ev.synchronize()
            self._judge(rec, host)

    def _judge(self, rec: StepRecord, vals: torch.Tensor) -> None:
        got = vals.tolist()  # the one small host read of the step
        rec.loss, rec.norm = got[0], (got[1] if len(got) > 1 else None)
        trig = self.tier.judge(rec.step, rec.loss, rec.norm)
        rank, world = _rank()
        if world > 1:  # all ranks replay together when one triggers
            with tool_work():
                flag = torch.tensor([0 if trig is None else 1], dtype=torch.int32)
                if torch.distributed.get_backend() == "nccl":
                    flag = flag.cuda()
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            if int(flag.item()) and trig is None:
                trig = Trigger("peer", rec.step, rec.loss)
        if trig is not None:
            self._on_trigger(trig, rank, world)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.history.settle()  # the snapshot's background copy ends before the update writes the state
        self._norm = grad_norm(self._params)

    # ---- a trigger ---------------------------------------------------------------------------
    def _on_trigger(self, trig: Trigger, rank: int, world: int) -> None:
        self.triggers.append(trig)
        if len(self.reports) >= self.options.max_triggers or self._step_fn is None:
            log.warning(f"[torchparity:WATCH] step {trig.step}: {trig.kind} (not confirmed: max_triggers={self.options.max_triggers} reached)")
            return
        log.warning(f"[torchparity:WATCH] step {trig.step} on rank {rank}: {trig.kind} ({trig.value}); replaying "
                    f"steps {self.history.snapshot_step}..{trig.step}")
        after = capture_state(self.model, self.optimizer, self.scaler)
        try:
            conf = confirm(self.history, self._execute_rec, self.model, self.optimizer, self.scaler,
                           self.options.output_dir, rank, self.options.reference)
        finally:
            restore_state(after, self.model, self.optimizer, self.scaler)  # the run goes on as if unwatched
            self.history.pause_timing()  # the replay is not a step: keep it out of the step time
        report = build_report(trig, conf, rank, world, self.history)
        write_report(report, self.options.output_dir, rank, len(self.reports))
        self.reports.append(report)
        rc = report["root_cause"]
        log.warning(f"[torchparity:WATCH] step {trig.step}: {'reproducible' if conf.reproducible else 'transient'}; "
                    f"root cause {rc['name']} ({rc['op']}) in {rc['module']!r}, {rc['phase']}; {report['path']}")
        if self.options.on_trigger == "raise":
            raise WatchTriggered(report)
        if self.options.on_trigger == "exit":
            sys.stderr.write(f"torchparity watch: step {trig.step}: {trig.kind}; report {report['path']}; "
                             f"exiting with code {self.options.exit_code}\n")
            sys.exit(self.options.exit_code)

    _step_fn: Callable[[Any], Any] | None = None

    def _execute_rec(self, rec: StepRecord) -> tuple[float, float | None]:
        self._norm = None
        loss = self._step_fn(rec.device_batch())  # type: ignore[misc]
        got = self._values(loss).tolist()
        return got[0], (got[1] if len(got) > 1 else None)


def watch(model: torch.nn.Module, optimizer: Any, output_dir: str | Path | None = None, *, scaler: Any = None,
          **options: Any) -> Watch:
    """Watch a training loop (see docs/watch.md for every option and the report).

    :param model: the model trained.
    :param optimizer: its optimizer (one ``torch.optim.Optimizer``).
    :param output_dir: where the report, the re-run's dump and the replay case go.
    :param scaler: the ``torch.amp.GradScaler`` if the loop uses one (snapshotted with the rest).
    :param options: ``every`` (snapshot every K steps; default 10), ``snapshot_share`` (0.02: a
        snapshot costing more than 2 % of the steps between two spaces them further apart, up to
        10 x ``every``, single process only; None: exactly every K steps), ``window`` (20), ``min_window``
        (5), ``loss_spike`` (10.0; None: off), ``grad_spike`` (10.0; None: off), ``memory_budget``
        (2GiB), ``on_trigger`` (``raise``, ``continue``, ``exit``), ``exit_code`` (3),
        ``reference`` (a backend for online compare in the re-run), ``max_triggers`` (1).
    """
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"watch: model must be a torch.nn.Module (got {type(model).__name__})")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"watch: optimizer must be a torch.optim.Optimizer (got {type(optimizer).__name__})")
    if scaler is not None and not all(hasattr(scaler, a) for a in ("state_dict", "load_state_dict", "scale")):
        raise UsageError(f"watch: scaler must be a torch GradScaler (got {type(scaler).__name__})")
    return Watch(model, optimizer, WatchOptions.make(output_dir, **options), scaler)
