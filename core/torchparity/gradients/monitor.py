"""``GradMonitor``: per-step, per-parameter gradient statistics and direction sketches.

Usage::

    import torchparity
    with torchparity.GradMonitor(model, "grads/npu", optimizer=opt):
        for x, y in data:
            loss_fn(model(x), y).backward()
            opt.step()          # the monitor closes the step here (optimizer post-step hook)
            opt.zero_grad()

Without ``optimizer=``, call ``mon.step()`` once per training step (after the backward passes).
Then compare two runs: ``torchparity grads grads/npu grads/cuda -o out``.

How it works: every parameter gets a ``register_post_accumulate_grad_hook`` (torch >= 2.1) that
summarises its gradient as soon as it is accumulated (with gradient accumulation, the last
micro-batch's call sees the accumulated gradient and wins). The summary (:mod:`.sketch`) stays on
the device; at the end of the step all summaries are stacked and copied to the host in one
transfer and written to ``DIR/rank{R}/step{S}.safetensors`` atomically. Where the hook does not
exist, the gradients are read from ``.grad`` when the step closes. The monitor only reads
gradients (its own computation is marked with ``tool_work`` so other torchparity modes ignore it)
and uses its own random generator: training results are bitwise identical with and without it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..capture.compiled import eager_hook
from ..capture.ranks import current_rank
from ..capture.tool_state import tool_work
from ..errors import UsageError
from . import store
from .sketch import DEFAULT_BOUNDS, LEVELS, STATS, block_signs, check_bounds, distribution, md5_of, summarize

#: ``optimizer=ANY_OPTIMIZER``: close a step after every ``step()`` of the first optimizer that runs
ANY_OPTIMIZER = "any"


class GradMonitor:
    """Record gradient statistics and direction sketches of ``model``'s parameters per step.

    :param model: the module whose parameters (``requires_grad``) are monitored.
    :param output_dir: the run directory (created); one file per step and rank.
    :param optimizer: close a step after each ``optimizer.step()`` (a post-step hook). Without it,
        call :meth:`step` yourself.
    :param sketch_dim: size of the direction sketch per parameter (default 256: cosine estimates
        good to about 1/sqrt(256) of the angle; raise it for more resolution).
    :param seed: seed of the sketch's random signs; both runs of a comparison must use the same.
    :param params: only parameters whose name contains one of these strings (default: all).
    :param every: record every ``every``-th step (steps are still counted).
    :param rank: rank written in file names (default: torch.distributed's rank, else $RANK, else 0).
    :param level: what is recorded besides the statistics and the sketch (msprobe's
        ``grad_level``): ``L0`` adds the MD5 of every gradient, ``L1`` (default) nothing more,
        ``L2`` the value distribution over ``bounds`` (fraction of elements per interval).
    :param bounds: the interval bounds of level L2 (default ``[-1, 0, 1]``: intervals
        ``(-inf, -1], (-1, 0], (0, 1], (1, inf)``), strictly increasing.
    :param steps: record only these steps (default: every step; ``every`` still applies).
    :param match: ``contains`` (default): ``params`` are substrings of parameter names;
        ``exact``: full names.
    :param layout: ``torchparity`` (default), or ``msprobe``: also write msprobe's gradient-probe
        files (``rank{R}/grad_summary_{S}.csv`` and, at L1/L2, ``rank{R}/step{S}/{param}.npy``
        direction files; see :mod:`.msprobe_layout`).

    ``optimizer="any"``: close a step after the ``step()`` of any optimizer (the first one that
    runs; msprobe counts steps so), without passing it.
    """

    def __init__(self, model: torch.nn.Module, output_dir: str | os.PathLike[str], *,
                 optimizer: torch.optim.Optimizer | str | None = None, sketch_dim: int = 256, seed: int = 0,
                 params: Iterable[str] | None = None, every: int = 1, rank: int | None = None,
                 level: str = "L1", bounds: Iterable[float] | None = None, steps: Iterable[int] | None = None,
                 match: str = "contains", layout: str = "torchparity") -> None:
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"GradMonitor needs a torch.nn.Module, got {type(model).__name__}")
        if int(sketch_dim) < 1 or int(every) < 1:
            raise UsageError("GradMonitor: sketch_dim and every must be >= 1")
        if level not in LEVELS:
            raise UsageError(f"GradMonitor: level must be one of {', '.join(LEVELS)} (got {level!r})")
        if match not in ("contains", "exact") or layout not in ("torchparity", "msprobe"):
            raise UsageError("GradMonitor: match is 'contains' or 'exact', layout is 'torchparity' or 'msprobe'")
        if isinstance(optimizer, str) and optimizer != ANY_OPTIMIZER:
            raise UsageError(f"GradMonitor: optimizer must be an optimizer, {ANY_OPTIMIZER!r} or None (got {optimizer!r})")
        try:
            self.bounds = check_bounds(list(bounds) if bounds is not None else list(DEFAULT_BOUNDS))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"GradMonitor: {exc}") from None
        self.level, self.layout = level, layout
        self.steps = None if steps is None else {int(s) for s in steps}
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise UsageError(f"GradMonitor: {out} exists and is not a directory")
        self.model, self.output_dir, self.optimizer = model, out, optimizer
        self.k, self.seed, self.every = int(sketch_dim), int(seed), int(every)
        wanted = [str(p) for p in params] if params is not None else None
        self.params: list[tuple[str, torch.nn.Parameter]] = [
            (n, p) for n, p in model.named_parameters()
            if p.requires_grad and (wanted is None or (n in wanted if match == "exact" else any(w in n for w in wanted)))]
        if not self.params:
            raise UsageError("GradMonitor: the model has no trainable parameters" + (f" matching {wanted}" if wanted else ""))
        self.rank = current_rank() if rank is None else int(rank)
        self.step_index = 0
        self.written: list[Path] = []
        self._signs: dict[str, torch.Tensor] = {}
        self._pending: dict[str, torch.Tensor] = {}
        self._extra: dict[str, dict[str, Any]] = {}  # level/layout data per parameter: dist, md5, signs
        self._bounds_t = torch.tensor(self.bounds, dtype=torch.float64)
        self._first_optimizer: int | None = None
        self._handles: list[Any] = []
        self._active = False
        self._warned = False
        self.uses_hooks = all(hasattr(p, "register_post_accumulate_grad_hook") for _, p in self.params)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> GradMonitor:
        """Install the hooks and write the run header (called by ``with``)."""
        if self._active:
            return self
        store.write_header(self.output_dir, self.k, self.seed, {"params": len(self.params), "level": self.level,
                                                               "bounds": self.bounds, "layout": self.layout})
        if self.uses_hooks:
            for name, p in self.params:
                self._handles.append(p.register_post_accumulate_grad_hook(self._hook(name)))
        if self.optimizer == ANY_OPTIMIZER:
            import torch.optim.optimizer as optim_mod

            if not hasattr(optim_mod, "register_optimizer_step_post_hook"):
                raise UsageError("GradMonitor: this torch has no global optimizer hooks; pass optimizer=")
            self._handles.append(optim_mod.register_optimizer_step_post_hook(eager_hook(self._on_any_optimizer)))
        elif self.optimizer is not None:
            if not hasattr(self.optimizer, "register_step_post_hook"):
                raise UsageError("GradMonitor: this torch has no Optimizer.register_step_post_hook; "
                                 "omit optimizer= and call monitor.step() after each optimizer step")
            self._handles.append(self.optimizer.register_step_post_hook(eager_hook(lambda *a, **k: self.step())))
        self._active = True
        return self

    def stop(self) -> None:
        """Write a step that is still open, remove the hooks."""
        if not self._active:
            return
        try:
            if self._pending:
                self.step()
        finally:
            for h in self._handles:
                h.remove()
            self._handles.clear()
            self._active = False

    def __enter__(self) -> GradMonitor:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- recording -------------------------------------------------------------------------------
    def _on_any_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        if id(optimizer) == self._first_optimizer:  # several optimizers: one step per iteration
            self.step()

    def _recording(self) -> bool:
        return self.step_index % self.every == 0 and (self.steps is None or self.step_index in self.steps)

    def _signs_for(self, name: str, p: torch.Tensor) -> torch.Tensor:
        s = self._signs.get(name)
        if s is None or s.device != p.device:
            s = block_signs(name, p.numel(), self.k, self.seed).to(p.device)
            self._signs[name] = s
        return s

    def _summarize(self, name: str, p: torch.Tensor) -> None:
        with tool_work(), torch.no_grad():
            signs = self._signs_for(name, p)
            # the gradient, and the parameter values it was computed with (same sketch): a
            # parameter that already differs between two runs explains the gradients that follow
            self._pending[name] = torch.cat([summarize(p.grad, signs, self.k), summarize(p.detach(), signs, self.k)])
            extra: dict[str, Any] = {}
            if self.level == "L2":
                extra["dist"] = distribution(p.grad, self._bounds_t)
            if self.level == "L0":
                extra["md5"] = md5_of(p.grad)  # a host copy of the gradient (msprobe's L0 does the same)
            elif self.layout == "msprobe":
                g = p.grad.to_dense() if p.grad.is_sparse else p.grad
                extra["signs"] = (g.detach() > 0).reshape(p.shape)  # direction data, stays on the device
            self._extra[name] = extra

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            if self._active and self._recording() and p.grad is not None:
                self._summarize(name, p)
        return hook

    def step(self) -> Path | None:
        """Close the current step: write what was recorded, advance the step counter."""
        path = None
        try:
            if self._recording():
                if not self.uses_hooks:
                    for name, p in self.params:
                        if p.grad is not None:
                            self._summarize(name, p)
                path = self._write()
        finally:
            self._pending = {}
            self._extra = {}
            self.step_index += 1
        return path

    def _write(self) -> Path | None:
        names = [n for n, _ in self.params if n in self._pending]
        if not names:
            return None
        shapes = [list(p.shape) for n, p in self.params if n in self._pending]
        dtypes = [str(p.dtype).replace("torch.", "") for n, p in self.params if n in self._pending]
        with tool_work(), torch.no_grad():
            by_device: dict[torch.device, list[int]] = {}
            for i, n in enumerate(names):
                by_device.setdefault(self._pending[n].device, []).append(i)
            rows: list[torch.Tensor | None] = [None] * len(names)
            for dev, idx in by_device.items():  # one device->host copy per device
                host = torch.stack([self._pending[names[i]].to(torch.float64) for i in idx]).cpu()
                for j, i in enumerate(idx):
                    rows[i] = host[j]
            mat = torch.stack(rows)  # type: ignore[arg-type]
        ns, w = len(STATS), len(STATS) + self.k
        dist = md5 = None
        with tool_work(), torch.no_grad():
            if self.level == "L2":
                dist = torch.stack([self._extra[n]["dist"].to(torch.float64) for n in names]).cpu()
        if self.level == "L0":
            md5 = [self._extra[n]["md5"] for n in names]
        try:
            path = store.write_step(self.output_dir, self.rank, self.step_index, names, shapes, dtypes,
                                    mat[:, :ns], mat[:, ns:w].to(torch.float32),
                                    mat[:, w:w + ns], mat[:, w + ns:].to(torch.float32), dist=dist, md5=md5)
            if self.layout == "msprobe":
                from . import msprobe_layout

                with tool_work(), torch.no_grad():
                    signs = {n: self._extra[n]["signs"].cpu().numpy() for n in names if "signs" in self._extra[n]}
                msprobe_layout.write_step(self.output_dir, self.rank, self.step_index, self.level, self.bounds, names,
                                          shapes, mat[:, :ns].numpy(), None if dist is None else dist.numpy(), md5, signs)
        except OSError as exc:  # never break training for a full disk: say it once
            if not self._warned:
                warnings.warn(f"torchparity GradMonitor: cannot write step {self.step_index} to {self.output_dir}: "
                              f"{exc.strerror or exc}; gradient recording continues in memory-less mode", stacklevel=2)
                self._warned = True
            return None
        self.written.append(path)
        return path
