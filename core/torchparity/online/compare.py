"""Online compare: check every op against a reference backend while the model runs.

::

    from torchparity import CompareWithReference          # alias: CompareWithCPU
    with CompareWithReference(reference="cpu", target_ops=["aten.addmm"], start_step=5, end_step=8,
                              on_failure="stop", save_failures="failures/", log_file="compare.log") as c:
        train(model)          # steps advance on optimizer.step(); c.step() by hand
    print(c.first_failure)

The compare is a consumer of the op stream (:func:`~torchparity.capture.op_stream.op_stream`: one
TorchDispatchMode for every torchparity tool, so backward and optimizer kernels are seen too, and
a dump or NaN/Inf screen running alongside costs no second interception). It takes the op's
name, phase and module from the stream (see :mod:`.locate`). For each op the inputs are copied to
the reference backend *before* the device op runs (in-place ops would mutate them), the op runs
on the device (the rest of the stream's chain: a device-layer consumer such as the emulated
device computes it), then on the reference twice — in the device's dtype and in high precision
(fp64 on the CPU) — and every output is judged fairly (see :mod:`.judge`). Views, random ops (op
tag ``nondeterministic_seeded``) and collectives are skipped with the reason in the log; for
tie-sensitive ops (sort, topk, max.dim ...) only values are compared, not indices.

The device is whatever the tensors live on; ``backend="emulated"`` runs the model on the emulated
device (CPU emulation of a bf16/fp16 device with planted faults), and an emulated device already
running (an :func:`emulate` context entered *outside* this one, or an emulated consumer on the op
stream) is detected: the device is then judged at the emulated precision.

Log lines carry greppable markers: ``[torchparity:error]`` (a failing op), ``[torchparity:naninf]``
(NaN/Inf in a device output), ``[torchparity:skip]`` (an op that cannot be compared, once per op
and reason) and ``[torchparity:summary]``.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten

from ..capture import ops as opinfo
from ..capture.op_stream import LAYER_OBSERVER, OpCall, OpConsumer, op_stream
from ..capture.ranks import current_rank
from ..capture.tool_state import tool_work
from ..errors import UsageError
from .case import safe_name, save_case
from .failure import (MARK_ERROR, MARK_NANINF, MARK_SKIP, MARK_SUMMARY, CompareFailure, OnlineFailure,
                      describe, format_failure)
from .judge import JudgeOptions, OpVerdict, dtype_name, judge_outputs
from .locate import OpLocator
from .reference import collect_outputs, run_reference, snapshot

__all__ = ["CompareWithReference", "CompareFailure", "OnlineFailure", "OpVerdict", "describe", "format_failure",
           "judge_outputs", "skip_reason", "MARK_ERROR", "MARK_NANINF", "MARK_SKIP", "MARK_SUMMARY"]

log = logging.getLogger("torchparity")

_WIDE = (torch.float32, torch.float64)


def _patterns(p: Iterable[str] | str | None) -> list[str] | None:
    if p is None:
        return None
    if isinstance(p, str):
        p = [p]
    return [str(x) for x in p]


def _op_matches(patterns: list[str], func: Any) -> bool:
    base = opinfo.base_name(func)
    names = (base, f"{opinfo.namespace(func)}.{base}", str(func))
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


def skip_reason(func: Any) -> str | None:
    """Why an op cannot be compared (None: it can)."""
    if opinfo.is_collective(func):
        return "collective (recorded by the dump, never re-executed)"
    if opinfo.is_random(func):
        return "random op (tag nondeterministic_seeded): a re-run would draw other numbers"
    if opinfo.is_view(func):
        return "view (aliases its input; nothing is computed)"
    if opinfo.is_uninitialised(func):
        return "result is uninitialised memory or metadata"
    if opinfo.workspace_inputs(func):
        return ("consumes the workspace of its forward kernel (opaque bytes laid out for the device's "
                "kernel and dtype): re-running it elsewhere would read them out of bounds")
    return None


class CompareWithReference(OpConsumer):
    """Check every op of the wrapped code against a reference backend (see module doc).

    An observer on the op stream (:data:`~torchparity.capture.op_stream.LAYER_OBSERVER`, module
    tracking on): :meth:`start` attaches it, :meth:`stop` detaches it.

    Args:
        reference: reference backend name (default: ``backends.reference`` of plugins.yaml, "cpu").
        backend: device backend to run the model on, entered outermost (e.g. ``"emulated"``);
            default: the tensors' own device.
        target_ops: only these ops (fnmatch on ``mm``, ``aten.mm``, ``aten.mm.default``).
        ignore_ops: never these ops.
        modules: only ops inside these module paths (fnmatch, ``layers.1.*``).
        start_step, end_step: the steps to check (inclusive; ``end_step=None``: to the end).
        ranks: the ranks to check (default: all).
        on_failure: ``"log"`` (go on) or ``"stop"`` (raise :class:`CompareFailure` at the first).
        save_failures: directory for failure cases (``torchparity replay CASE``); ``None``: none.
        max_saved: at most this many cases are saved.
        log_file: also append the log lines to this file.
        model: root module, to name modules by their path in it from the start.
        checkers: names of the online checkers to use (default: every enabled one).
        judge: options of the built-in judge (used when no online checker is installed).
        worst: how many worst elements to show per failure.
    """

    #: how a refusal names this tool (a torch.compile'd model: capture/compiled.py)
    tool_name = "online compare (CompareWithReference)"

    layer = LAYER_OBSERVER
    needs_modules = True
    #: steps advance only on :meth:`step` (the torch_musa façade), never on ``optimizer.step()``
    manual_steps = False

    def __init__(self, reference: str | None = None, *, backend: str | None = None,
                 target_ops: Sequence[str] | str | None = None, ignore_ops: Sequence[str] | str | None = None,
                 modules: Sequence[str] | str | None = None, start_step: int = 0, end_step: int | None = None,
                 ranks: Sequence[int] | None = None, on_failure: str = "log", save_failures: str | Path | None = None,
                 max_saved: int = 20, log_file: str | Path | None = None, model: torch.nn.Module | None = None,
                 checkers: Sequence[str] | None = None, judge: JudgeOptions | None = None, worst: int = 5) -> None:
        if on_failure not in ("log", "stop"):
            raise UsageError(f"on_failure must be 'log' or 'stop', got {on_failure!r}")
        if start_step < 0 or (end_step is not None and end_step < start_step):
            raise UsageError(f"bad step range start_step={start_step} end_step={end_step}")
        self.reference_name = reference
        self.backend_name = backend
        self.target_ops = _patterns(target_ops)
        self.ignore_ops = _patterns(ignore_ops) or []
        self.modules = _patterns(modules)
        self.start_step, self.end_step = start_step, end_step
        self.ranks = None if ranks is None else {int(r) for r in ranks}
        self.on_failure = on_failure
        self.save_dir = Path(save_failures) if save_failures is not None else None
        self.max_saved = max_saved
        self.log_file = Path(log_file) if log_file is not None else None
        self.model = model
        self.checker_names = list(checkers) if checkers is not None else None
        self.judge_options = judge or JudgeOptions()
        self.n_worst = worst
        # results
        self.failures: list[OnlineFailure] = []
        self.naninf: list[str] = []
        self.skipped: Counter[str] = Counter()
        self.checked = 0
        self.saved = 0
        self.log_lines: list[str] = []
        self.emulated_dtype: torch.dtype | None = None
        self._mode_emulated: torch.dtype | None = None  # an emulated device mode below ours
        self._chain_seen: tuple[OpConsumer, ...] | None = None
        # state
        self._stack: ExitStack | None = None
        self._locator: OpLocator | None = None
        self._skip_logged: set[tuple[str, str]] = set()
        self._checkers: list[Any] = []
        self._ref_backend: Any = None
        self._ref_device: torch.device = torch.device("cpu")
        self._high: Any = None
        self._rank = 0
        self._fh: Any = None

    # ---- results ----------------------------------------------------------------------------
    @property
    def first_failure(self) -> OnlineFailure | None:
        return self.failures[0] if self.failures else None

    @property
    def current_step(self) -> int:
        return self._locator.step if self._locator is not None else 0

    # ---- lifecycle --------------------------------------------------------------------------
    def _setup_backends(self, stack: ExitStack) -> None:
        from ..plugins import get_registry

        reg = get_registry()
        ref = self.reference_name or getattr(reg.config, "reference_backend", None) or "cpu"
        if ref not in reg.backends:
            raise UsageError(f"unknown reference backend {ref!r}; installed: {', '.join(sorted(reg.backends))}")
        self._ref_backend = reg.backends[ref]
        avail = self._ref_backend.is_available()
        if not avail:
            raise UsageError(f"reference backend {ref!r} is not available here: {avail.reason}")
        self._ref_device = self._ref_backend.device()
        self._high = self._ref_backend.reference_dtype
        checkers = [c for c in reg.checkers.values() if "online" in getattr(c, "scopes", ())]
        if self.checker_names is not None:
            known = {c.name for c in checkers}
            missing = [n for n in self.checker_names if n not in known]
            if missing:
                raise UsageError(f"unknown online checker(s) {', '.join(missing)}; enabled: {', '.join(sorted(known)) or 'none'}")
            checkers = [c for c in checkers if c.name in self.checker_names]
        self._checkers = checkers
        if self.backend_name is not None:
            if self.backend_name not in reg.backends:
                raise UsageError(f"unknown backend {self.backend_name!r}; installed: {', '.join(sorted(reg.backends))}")
            b = reg.backends[self.backend_name]
            avail = b.is_available()
            if not avail:
                raise UsageError(f"backend {self.backend_name!r} is not available here: {avail.reason}")
            stack.enter_context(b.activate())

    def _detect_emulation(self) -> None:
        """Is the device emulated, and at which dtype? An emulated device is either a dispatch
        mode below the stream's (entered before) or a consumer on the op stream (a device-layer
        consumer with ``torchparity_emulated``: looked up again whenever the chain changes)."""
        if self._chain_seen is None:  # at start: the mode stack
            try:
                from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

                modes = _get_current_dispatch_mode_stack()
            except Exception:  # pragma: no cover - private API moved
                modes = []
            self._mode_emulated = next((getattr(m, "emulated_dtype", None) for m in reversed(modes)
                                        if getattr(m, "torchparity_emulated", False)), None)
        chain = self._chain_seen = op_stream().consumers
        consumer = next((c for c in reversed(chain) if getattr(c, "torchparity_emulated", False)), None)
        self.emulated_dtype = getattr(consumer, "emulated_dtype", None) if consumer is not None else self._mode_emulated

    def start(self) -> "CompareWithReference":
        if self._stack is not None:
            raise UsageError("this online compare is already running")
        stack = ExitStack()
        try:
            self._setup_backends(stack)
            if self.log_file is not None:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.log_file, "a", encoding="utf-8")
                stack.callback(self._fh.close)
            self._locator = OpLocator(manual=self.manual_steps)
            self._rank = current_rank()
            self._chain_seen = None
            stream = op_stream()
            stream.attach(self, model=self.model)
            stack.callback(stream.detach, self)  # before the backend leaves (LIFO)
            self._detect_emulation()
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        emu = f", device emulated at {dtype_name(self.emulated_dtype)}" if self.emulated_dtype else ""
        self._log(logging.INFO, f"[torchparity:start] online compare against {self._ref_backend.name} "
                                f"(checkers: {', '.join(c.name for c in self._checkers) or 'built-in'}{emu})")
        return self

    def stop(self) -> None:
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        try:
            first = self.first_failure
            skipped = ", ".join(f"{r.split(' (')[0]}: {n}" for r, n in self.skipped.most_common())
            self._log(logging.WARNING if first else logging.INFO,
                      f"{MARK_SUMMARY} checked {self.checked} ops, {len(self.failures)} failed"
                      + (f" (first: {first.name} in {first.module or '<root>'} at step {first.step})" if first else "")
                      + f", {len(self.naninf)} with NaN/Inf, skipped {sum(self.skipped.values())}"
                      + (f" ({skipped})" if skipped else ""))
        finally:
            stack.close()

    @property
    def running(self) -> bool:
        return self._stack is not None

    def step(self) -> None:
        """End the current step by hand (steps also end on ``optimizer.step()``).

        This ends the op stream's step, so every tool on the stream (a dump running alongside
        too) starts a new step and its op names restart (``Aten.mm.0...``)."""
        if self._stack is None or self._locator is None:
            raise UsageError("the online compare is not running")
        self._locator.next_step()

    def on_step_end(self, step: int) -> None:
        """The op stream ended a step (``optimizer.step()`` or ``op_stream().next_step()``)."""
        if self._locator is not None:
            self._locator.stream_step_ended()

    def __enter__(self) -> "CompareWithReference":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- logging ----------------------------------------------------------------------------
    def _log(self, level: int, text: str) -> None:
        self.log_lines.append(text)
        if self._fh is not None:
            self._fh.write(text + "\n")
            self._fh.flush()
        log.log(level, text)

    # ---- per op -----------------------------------------------------------------------------
    def _active(self) -> bool:
        s = self._locator.step
        if s < self.start_step or (self.end_step is not None and s > self.end_step):
            return False
        return self.ranks is None or self._rank in self.ranks

    def _selected(self, func: Any, module: str, phase: str = "") -> bool:
        if self.target_ops is not None and not _op_matches(self.target_ops, func):
            return False
        if self.ignore_ops and _op_matches(self.ignore_ops, func):
            return False
        if self.modules is not None and not any(fnmatch.fnmatchcase(module, p) or module.startswith(p + ".")
                                                or module == p for p in self.modules):
            return False
        return True

    def _skip(self, name: str, func: Any, reason: str) -> None:
        self.skipped[reason] += 1
        key = (opinfo.base_name(func), reason)
        if key not in self._skip_logged:
            self._skip_logged.add(key)
            self._log(logging.INFO, f"{MARK_SKIP} {name} ({func}): {reason}")

    def _same_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if self.emulated_dtype is not None and dtype in _WIDE:
            return self.emulated_dtype
        return dtype

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        """One op from the stream: inputs copied, ``run`` (the device), then the reference."""
        name = call.name
        if name is None or not self._active():
            return run(*args, **kwargs)
        if op_stream().consumers is not self._chain_seen:  # a consumer came or left: emulated?
            self._detect_emulation()
        func, phase = call.info.func, call.phase
        module, module_class = call.where()
        if not self._selected(func, module, phase):
            return run(*args, **kwargs)
        reason = skip_reason(func)
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if reason is None and any(t.layout != torch.strided or t.device.type == "meta" for t in flat_in):
            reason = "non-strided or meta tensor: not supported by the reference"
        if reason is not None:
            self._skip(name, func, reason)
            return run(*args, **kwargs)
        # the stream's mode is off the stack here: tool_work is for the other modes below it
        with tool_work():
            ref_args, ref_kwargs = snapshot((args, kwargs), "cpu")
            in_desc = [f"{i}: {describe(t)}" for i, t in enumerate(flat_in)]
        out = run(*args, **kwargs)
        with tool_work():
            try:
                failure = self._check(func, name, module, module_class, phase, args, kwargs, out, ref_args,
                                      ref_kwargs, in_desc)
            except Exception as exc:  # noqa: BLE001 - the tool must never break the user's training
                failure = None
                self._skip(name, func, f"not judged: the check failed ({type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
        if failure is not None and self.on_failure == "stop":
            raise CompareFailure(failure)
        return out

    def _check(self, func: Any, name: str, module: str, module_class: str | None, phase: str, args: tuple,
               kwargs: dict, out: Any, ref_args: tuple, ref_kwargs: dict, in_desc: list[str]) -> OnlineFailure | None:
        dev_outs = collect_outputs(func, args, kwargs, out)
        ref = run_reference(func, ref_args, ref_kwargs, same_dtype=self._same_dtype, high_dtype=self._high,
                            device=self._ref_device)
        if ref.error is not None:
            self._skip(name, func, ref.error)
            return None
        if ref.same is None or ref.high is None or len(ref.same) != len(dev_outs):
            self._skip(name, func, "the reference returned a different number of outputs")
            return None
        scratch = opinfo.workspace_outputs(func)
        if scratch:  # a kernel's workspace is not a result: its size and bytes depend on kernel and dtype
            dev_outs = [None if i in scratch else t for i, t in enumerate(dev_outs)]
            ref.notes.append(f"output(s) {', '.join(map(str, sorted(scratch)))}: kernel workspace, not compared")
        self.checked += 1
        tie = opinfo.is_tie_sensitive(func)
        op = str(func)
        verdict = judge_outputs(func, name, dev_outs, ref.same, ref.high, same_dtype=self._same_dtype,
                                checkers=self._checkers, options=self.judge_options, n_worst=self.n_worst)
        if verdict is None and tie:
            self._skip(name, func, "tie-sensitive op with index outputs only")
            return None
        if verdict is None or verdict.result.verdict == "pass":
            return None
        i, r = verdict.output, verdict.result
        out_desc = [f"{j}: {describe(t)}" for j, t in enumerate(dev_outs) if t is not None]
        f = OnlineFailure(name=name, op=op, module=module, module_class=module_class, step=self._locator.step,
                          rank=self._rank, phase=phase, output=i, checker=r.checker, verdict=r.verdict,
                          reason=r.reason, metrics=dict(r.metrics), inputs=in_desc, outputs=out_desc,
                          notes=list(ref.notes), worst=verdict.worst)
        if r.verdict == "warning":
            if "NaN/Inf" in r.reason:
                self.naninf.append(name)
                # the reference holds the same NaN/Inf (a mask's -inf in fp16, values carried in):
                # information, not a warning (a clean model must not fill the log with alarms)
                self._log(logging.INFO, f"{MARK_NANINF} {name} ({op}) module={module or '<root>'} "
                                           f"step {f.step} {phase}: {r.reason}")
            return None
        emu = dtype_name(self.emulated_dtype) if self.emulated_dtype is not None else None
        if self.save_dir is not None and self.saved < self.max_saved:
            f.case = str(self._save(f, func, ref_args, ref_kwargs, dev_outs, emu))
        self.failures.append(f)
        if "NaN/Inf" in r.reason:
            self.naninf.append(name)
        self._log(logging.WARNING, format_failure(f, emu))
        return f

    def _save(self, f: OnlineFailure, func: Any, args: tuple, kwargs: dict, outs: list[Any], emu: str | None) -> Path | None:
        d = self.save_dir / safe_name(f"step{f.step}_rank{f.rank}_{f.name}")
        meta = {"name": f.name, "op": f.op, "module": f.module, "module_class": f.module_class, "step": f.step,
                "rank": f.rank, "phase": f.phase, "verdict": f.verdict, "reason": f.reason, "checker": f.checker,
                "metrics": f.metrics, "worst": f.worst, "notes": f.notes,
                "device": {"type": outs[f.output].device.type if outs[f.output] is not None else "cpu",
                           "backend": self.backend_name, "emulated_dtype": emu},
                "reference": self._ref_backend.name, "torch_version": torch.__version__}
        try:
            save_case(d, meta, args, kwargs, [None if t is None else t.detach().to("cpu") for t in outs])
        except (TypeError, OSError, RuntimeError) as exc:
            self._log(logging.WARNING, f"{MARK_ERROR} could not save the case of {f.name}: {exc}")
            return None
        self.saved += 1
        return d
