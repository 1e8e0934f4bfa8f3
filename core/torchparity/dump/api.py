"""``torchparity.dump``: capture every op of a training run to a dump directory.

::

    with torchparity.dump("dumps/gpu", level="aten", mode="statistics") as d:
        for batch in loader:
            loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
            # steps advance by themselves on optimizer.step(); d.step() advances by hand

    d = torchparity.dump(...); d.start(); ...; d.stop()
    torchparity.dump(config="dump.yaml")      # options from YAML, or an msprobe config.json
"""

from __future__ import annotations

import os

import atexit
import logging
import weakref
from contextlib import ExitStack
from typing import Any

import torch

from ..capture import gc_quiet
from ..capture.api_mode import ApiCaptureMode
from ..capture.compiled import (COMPILED_DUMP_OK, MODULE_LEVEL_OK, CompiledCallGuard, CompiledModelError,
                                compiled_blocks, compiled_blocks_ok, compiled_functions_note, eager_hook, is_compiled,
                                quiet_compiled, refuse_compiled, restore_classes)
from ..capture.aten_mode import AtenCaptureMode
from ..capture.module_capture import ModuleCapture
from ..capture.module_tracker import ModuleTracker
from ..capture.op_stream import op_stream
from ..capture.ranks import current_rank, world_size
from ..capture.session import CaptureSession
from ..capture.stats import CHECKSUM_ALGORITHM
from ..errors import UsageError
from ..records import FORMAT_NAME, FORMAT_VERSION
from .options import DumpOptions, check_output_dir, load_options_file
from .device_env import describe_device
from .writer import DumpWriter
from .world import complete_headers, start_layout  # distdump

log = logging.getLogger("torchparity")
_ACTIVE: "weakref.WeakSet[Dumper]" = weakref.WeakSet()


def _plugin_consumers(options: DumpOptions) -> list[Any]:
    """The op-stream consumers installed plugins supply for this dump (hook
    ``torchparity_op_consumers``); a plugins.yaml that cannot be read leaves them out (its
    problem is told, as for the header's device description), it never stops the dump."""
    from ..errors import TorchparityError
    from ..plugins import op_consumers

    try:
        return op_consumers(options)
    except TorchparityError as exc:
        log.warning("torchparity: no plugin op-stream consumers for this dump (%s)", exc)
        return []


def _activate_backend(name: str) -> Any:
    from ..plugins import get_registry

    reg = get_registry()
    if name not in reg.backends:
        raise UsageError(f"unknown backend {name!r}; installed: {', '.join(sorted(reg.backends)) or 'none'} "
                         "(see `torchparity plugins`)")
    backend = reg.backends[name]
    avail = backend.is_available()
    if not avail:
        raise UsageError(f"backend {name!r} is not available here: {getattr(avail, 'reason', '')}")
    return backend.activate()


def _step_header(o: DumpOptions) -> Any:
    """What each step's header.json says about the step's tier (a scheduled dump): ``tier``
    (full / light) and the level and mode its records were taken at."""
    light = o.light_options() if o.light is not None else None

    def info(step: int) -> dict[str, Any]:
        tier = o.tier(step)
        if tier == "light" and light is not None:
            return {"tier": "light", "level": light.level, "mode": light.mode, "checksum": None}
        return {"tier": tier or "full"}

    return info


class Dumper:
    """A running (or ready) dump. Use as a context manager, or call start()/stop()."""

    def __init__(self, options: DumpOptions, model: torch.nn.Module | None = None) -> None:
        self.options = options
        self.model = model
        self._stack: ExitStack | None = None
        self.session: CaptureSession | None = None
        self.writer: DumpWriter | None = None
        self._module_capture: ModuleCapture | None = None
        self._api_mode: ApiCaptureMode | None = None
        self._opt_hooks: list[Any] = []
        self._first_optimizer: int | None = None
        self._world: dict[str, Any] = {}  # distdump: the world layout written at start
        self._compiled: Any = None  # compile/in_dump.CompiledInDump: a compiled model's graphs

    @property
    def path(self) -> str:
        return self.options.path

    @property
    def current_step(self) -> int:
        return self.session.step if self.session else 0

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Dumper":
        if self._stack is not None:
            raise UsageError("this dump is already running; call stop() first")
        o = self.options
        what = f"torchparity.dump(level={o.level!r})"
        # a compiled model at the aten level: its graphs are captured by the compile backend
        # (compile/in_dump.py); the API level (and torch < 2.2) still refuse it
        # an eager model whose blocks are compiled one by one: each block's graphs are captured alike
        blocks = compiled_blocks(self.model) if o.levels & {"aten", "api"} else []
        compiled_aten = (is_compiled(self.model) or bool(blocks)) and o.levels == {"aten"} and COMPILED_DUMP_OK
        if (is_compiled(self.model) or blocks) and "api" in o.levels and COMPILED_DUMP_OK:
            which, eager = ((f"compiled blocks ({blocks[0][0]!r}, ...)", "the model without torch.compile") if blocks
                            else ("a torch.compile'd model", "the eager model (model._orig_mod)"))
            raise CompiledModelError(
                f"{what} cannot watch {which} at the API level: it would run it eagerly and change its numerics. "
                f"Use level='aten' (captures the compiled graphs), {eager} or level='module', see docs/compile.md")
        if blocks and compiled_aten and not compiled_blocks_ok():
            raise CompiledModelError(
                f"{what} captures compiled blocks ({blocks[0][0]!r}, ...) on torch >= 2.5 (Dynamo tracing "
                f"parameters as graph inputs, torch._dynamo.config.inline_inbuilt_nn_modules), not on torch "
                f"{torch.__version__}: compile the whole model, dump the eager model, or dump at level='module'; "
                f"see docs/compile.md")
        if not compiled_aten and ("aten" in o.levels or "api" in o.levels or not MODULE_LEVEL_OK):
            refuse_compiled(self.model, what)  # before anything is written
        if compiled_aten:
            from ..compile.in_dump import blocks_backend

            blocks_backend(blocks or [("", self.model)], what)  # a backend that cannot be wrapped: one line, before anything is written
        from .. import __version__

        header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "tool_version": __version__,
                  "level": o.level, "mode": o.mode, "checksum": CHECKSUM_ALGORITHM if o.mode == "md5" else None, "world_size": world_size(),
                  "backend": describe_device(o.backend), "config": o.to_json()}
        header["world"] = self._world = start_layout()  # distdump: the job's layout (dump/world.py)
        if o.scheduled:
            header["schedule"] = {"steps": o.steps, "every": o.every, "light": o.light}
        self.writer = DumpWriter(o.path, header, fsync=o.fsync, max_bytes=o.max_bytes, rank=current_rank(),
                                 max_queue_bytes=o.max_queue_bytes,
                                 step_header=self._step_header_fn(o, compiled_aten),
                                 summaries=o.summaries)
        tracker = ModuleTracker()
        root = self.model._orig_mod if compiled_aten and not blocks else self.model  # names without "_orig_mod."
        if root is not None:
            tracker.add_root(root)
        self.session = CaptureSession(o, self.writer, tracker)
        stack = ExitStack()
        try:
            if compiled_aten:  # recompiled with the capture before the dump's global hooks exist
                from ..compile.in_dump import CompiledInDump

                self._compiled = CompiledInDump(self.model, self.session, self.writer, what, blocks=blocks or None)
                self._compiled.install()
                stack.callback(self._compiled.remove)
            if not compiled_aten:  # a module-level dump of compiled parts: Dynamo's "global hooks" warning is untrue
                stack.callback(restore_classes, quiet_compiled(self.model))  # (the hooks return while it traces)
            gc_quiet.hold()  # the collector skips the process's old heap while the dump runs
            stack.callback(gc_quiet.release)
            if o.backend is not None:
                # A device backend's context (the emulated device: a device-layer consumer of the
                # op stream) is innermost in the stream's chain, so the dump sees what it computed.
                stack.enter_context(_activate_backend(o.backend))
            stack.enter_context(tracker)
            self._module_capture = ModuleCapture(self.session, tracker,
                                                 record="module" in o.levels or o.light is not None,
                                                 tag=bool(o.levels & {"api", "aten"}))
            stack.callback(self._module_capture.detach)
            import torch.optim.optimizer as optim_mod

            self._opt_hooks = [
                optim_mod.register_optimizer_step_pre_hook(eager_hook(self._on_opt_pre)),
                optim_mod.register_optimizer_step_post_hook(eager_hook(self._on_opt_post)),
            ]
            if "aten" in o.levels:
                stack.enter_context(AtenCaptureMode(self.session))
            elif torch.distributed.is_available() and (torch.distributed.is_initialized()
                                                       or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1):
                # collectives only: a distributed run (or one about to be, under torchrun); a
                # single process skips the per-op dispatch entirely
                stack.enter_context(AtenCaptureMode(self.session, collectives_only=True))
            if "api" in o.levels:
                guard = CompiledCallGuard(f"torchparity.dump(level={o.level!r})")
                guard.install()  # the API level's function mode would break Dynamo: refuse a compiled call
                stack.callback(guard.remove)
                self._api_mode = ApiCaptureMode(self.session)
                stack.enter_context(self._api_mode)
            if o.replica_check:  # per-parameter replica hashes (torchparity.replicas.recorder)
                stack.enter_context(self._replica_recorder())
            # installed plugins' consumers of the op stream, for the dump's lifetime
            for consumer in _plugin_consumers(o):
                stack.enter_context(op_stream().attached(consumer, root))
        except Exception:
            stack.close()
            self.writer.close()
            raise
        self._stack = stack
        _ACTIVE.add(self)
        return self

    def stop(self) -> None:
        """Stop capturing, write everything, close the dump (also done at interpreter exit)."""
        if self._stack is None:
            return
        try:
            self._finish_step_records()
            self._stack.close()
        finally:
            for h in self._opt_hooks:
                h.remove()
            self._opt_hooks = []
            self._stack = None
            if self.session is not None:
                self.session.flush()
            if self.writer is not None:
                self.writer.close()  # a write error was told once, by the writer
                complete_headers(self.writer.root, current_rank(), self._world)  # distdump: groups made later
            _ACTIVE.discard(self)

    def step(self) -> None:
        """End the current step by hand (steps also end on ``optimizer.step()``)."""
        if self.session is None:
            raise UsageError("the dump is not running; call start() first")
        self._finish_step_records()
        self.session.advance_step()
        if self._module_capture is not None:
            self._module_capture.new_step()

    def flush(self) -> None:
        """Write everything captured so far to disk and wait for it (no-op once stopped)."""
        if self._stack is not None and self.session is not None and self.writer is not None:
            self.session.flush()
            self.writer.flush()

    def _step_header_fn(self, o: DumpOptions, compiled: bool) -> Any:
        """Each step's header: the tier (a scheduled dump), the compiled capture's graphs, and what
        is not captured of torch.compile'd functions once the process has run some."""
        tier = _step_header(o) if o.scheduled else None

        def info(step: int) -> dict[str, Any]:
            out = dict(tier(step)) if tier is not None else {}
            if compiled and self._compiled is not None:
                out["compile"] = self._compiled.header()
            note = compiled_functions_note()
            if note is not None:  # what the dump cannot see of compiled functions (docs/compile.md)
                out["compiled_functions"] = note
            return out

        return info

    def _finish_step_records(self) -> None:
        if self._compiled is not None and self.session is not None:
            self._compiled.end_step()
        if self._module_capture is not None and self.session is not None:
            self._module_capture.flush_backward()
        if self._api_mode is not None and self.session is not None:
            prev, self.session.busy = self.session.busy, False
            try:
                self._api_mode.flush_backward()
            finally:
                self.session.busy = prev

    def _replica_recorder(self) -> Any:
        """The dump option ``replica_check``: hashes of each parameter and gradient per step."""
        from ..replicas.recorder import ReplicaRecorder

        o = self.options
        return ReplicaRecorder(o.path, current_rank(), self.model, lambda: self.current_step,
                               wanted=lambda s: o.tier(s) is not None and (o.ranks is None or current_rank() in o.ranks),
                               fsync=o.fsync)

    # ---- optimizer hooks ---------------------------------------------------------------------
    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.session is not None:
            self._finish_step_records()
            self.session.in_optimizer = True

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.session is None:
            return
        self.session.in_optimizer = False
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
        if id(optimizer) == self._first_optimizer:  # several optimizers: one step per iteration
            self.step()

    def __enter__(self) -> "Dumper":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self.writer is not None and self._stack is not None:
            # the training stopped with an exception (a dead peer rank, an OOM, Ctrl-C): the
            # footer of the step it stopped in says so; everything captured until then is kept
            what = " ".join(f"{exc_type.__name__}: {exc}".split())
            self.writer.interrupted = what if len(what) <= 300 else what[:297] + "..."
            log.warning("torchparity: the run stopped at step %d with %s; the dump in %s keeps everything "
                        "captured until then", self.current_step, exc_type.__name__, self.path)
        self.stop()


def dump(path: str | None = None, *, config: str | None = None, model: torch.nn.Module | None = None,
         **options: Any) -> Dumper:
    """Create a dump of everything the model computes (start it with ``with`` or ``.start()``).

    :param path: output directory (created). Layout: ``path/step{S}/rank{R}/``. A path that is a
        file or cannot be written raises :class:`~torchparity.errors.UsageError` here, before
        training starts; so does a directory another process is dumping the same rank into (at
        ``start()``).
    :param config: a YAML file of options, or an msprobe ``config.json`` (mapped; unknown keys rejected).
    :param model: optional root module, to name modules by their path in it from the start.
    :param options: any :class:`~torchparity.dump.options.DumpOptions` field: ``level`` (module,
        api, aten, mix), ``mode`` (statistics, md5, tensor), ``steps``, ``ranks``, ``phases``,
        ``io``, ``ops``, ``exclude_ops``, ``scope``, ``op_range``, ``skip``, ``stack``,
        ``max_bytes``, ``backend`` ...; when: ``steps``, ``every`` (full capture on steps 0, N,
        2N, ...) and ``light="module"`` (module records, statistics, on the other steps).
    """
    kwargs: dict[str, Any] = {}
    if config is not None:
        kwargs.update(load_options_file(config))
    kwargs.update(options)
    if path is not None:
        kwargs["path"] = path
    try:
        opts = DumpOptions(**kwargs)
    except TypeError as exc:
        raise UsageError(f"unknown dump option: {exc}") from None
    check_output_dir(opts.path)  # before training starts: a read-only or file path is one clear line
    return Dumper(opts, model=model)


@atexit.register
def _close_active_dumps() -> None:
    for d in list(_ACTIVE):
        try:
            d.stop()
        except Exception:  # pragma: no cover - best effort at exit
            pass
