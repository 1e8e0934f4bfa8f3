"""torch_musa compare-tool entry points over torchparity's engine.

Replace ``from torch_musa.utils.compare_tool import ...`` with
``from torchparity.compat.torch_musa import ...``; the same calls work::

    open_module_tracker(model)
    with CompareWithCPU(atol=0.001, rtol=0.001, verbose=True, target_op=["torch.ops.aten.addmm"],
                        start_step=5, should_log_to_file=True, output_dir="path_to_save") as c:
        for step in range(n):
            train_step(model)
            c.step()
    correct, args, kwargs, out = compare_for_single_op("path_to_save/torch.ops.aten.addmm_inputs.pkl",
                                                       torch.ops.aten.addmm, atol=0.01, rtol=0.01)

Nothing is re-implemented: :class:`CompareWithCPU` is :class:`torchparity.online.compare.
CompareWithReference` (reference ``cpu``, its built-in judge with the given ``atol``/``rtol`` as the
tolerance of every dtype), :class:`NanInfTracker` is :class:`torchparity.online.naninf.NanInfTracker`,
the single-op functions read the engine's failure cases. What is added is the translation of the
parameters and of the engine's findings into torch_musa's log lines, so that grep habits keep
working:

* ``[ERROR] <modules>/torch.ops.aten.addmm(forward) fails to pass CompareWithCPU test`` + the
  ``....... input .........`` / ``...... output ........`` / ``...... compare with cpu .......``
  block with ``Element at index (i, j) is not close: D(device) vs R(cpu)`` lines (the engine's
  worst elements);
* ``[WARNING] ... has NaN/Inf`` for NaN/Inf (online compare and NaN/Inf tracker);
* ``<op>(forward) is in white_list, pass``; with ``verbose``: ``starts to run ...`` and
  ``succeeds to pass CompareWithCPU test`` per op;
* ``<modules>/`` prefixes (module class names, outermost first) once :func:`open_module_tracker`
  was called for the model.

Differences (see docs/migrating.md): steps advance only on ``step()`` (as in torch_musa, never on
``optimizer.step()``); ``dump_error_data`` writes a torchparity failure case (JSON + safetensors,
never a pickle) under ``output_dir`` and stops at the first failure by raising
:class:`~torchparity.online.compare.CompareFailure`; the single-op functions accept the seed's
``DIR/torch.ops.aten.addmm_inputs.pkl`` path and resolve it to that case. A low-precision op is not
failed for rounding the way the same-dtype CPU reference rounds too (torchparity's fair judge);
above that, ``atol``/``rtol`` decide.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TextIO

import torch

from ..errors import UsageError
from ..online.compare import MARK_ERROR, MARK_SUMMARY, CompareWithReference, OnlineFailure
from ..online.judge import DEFAULT_TOLERANCE, JudgeOptions
from ..online.naninf import MARKER as _NANINF_MARKER
from ..online.naninf import NanInfFinding
from ..online.naninf import NanInfTracker as _EngineNanInfTracker
from .torch_musa_single import _op_pattern, compare_for_single_op, nan_inf_track_for_single_op

__all__ = ["CompareWithCPU", "NanInfTracker", "open_module_tracker", "ModuleInfo", "compare_for_single_op",
           "nan_inf_track_for_single_op"]

_SEP = "============================"

# ---- module tracking ---------------------------------------------------------------------------

#: models opened with :func:`open_module_tracker` (weakly held)
_TRACKED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


@dataclass
class ModuleInfo:
    """A module of a tracked model: its ``named_modules()`` path, class, and the torch_musa-style
    prefix (class names of the modules that run around it, outermost first, ``/``-joined)."""

    path: str
    cls: str
    prefix: str

    @classmethod
    def of(cls, model: torch.nn.Module, path: str) -> "ModuleInfo":
        """The info of the module at ``path`` in ``model`` (containers that never run, like
        ``ModuleList``, are left out of the prefix as torch_musa's hooks never see them)."""
        names = [type(model).__name__]
        mod = model
        for part in [p for p in path.split(".") if p]:
            mod = getattr(mod, part, None) if not isinstance(mod, _CONTAINERS) else mod._modules.get(part)
            if mod is None:
                break
            if not isinstance(mod, _CONTAINERS):
                names.append(type(mod).__name__)
        return cls(path=path, cls=names[-1], prefix="/".join(names))


def open_module_tracker(model: torch.nn.Module) -> ModuleInfo:
    """Name the ops of ``model`` by their module hierarchy in the logs of :class:`CompareWithCPU`
    and :class:`NanInfTracker` (``Net/Block/Linear/torch.ops.aten.addmm(forward)``).

    The tracking itself is torchparity's module tracker, which the tools run anyway; this tells
    them to use ``model`` as the root and to print the prefixes. Returns the root's info."""
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"open_module_tracker: expected a torch.nn.Module, got {type(model).__name__}")
    _TRACKED.add(model)
    return ModuleInfo.of(model, "")


def _tracked_model(model: torch.nn.Module | None) -> torch.nn.Module | None:
    if model is not None:
        return model
    models = list(_TRACKED)
    return models[-1] if models else None


# ---- shared helpers ----------------------------------------------------------------------------


def _op_label(op: str) -> str:
    """``aten.addmm.default`` -> ``torch.ops.aten.addmm`` (torch_musa's op naming)."""
    parts = op.split(".")
    return "torch.ops." + ".".join(parts[:2]) if len(parts) >= 2 else "torch.ops." + op


def _check_steps(start_step: int, end_step: int | None) -> None:
    if start_step < 0 or (end_step is not None and end_step <= start_step):
        raise UsageError(f"bad step range: need 0 <= start_step < end_step (got start_step={start_step}, "
                         f"end_step={end_step})")


def _rank_enabled(enable_ranks: Sequence[int] | None) -> bool:
    from ..capture.ranks import current_rank

    return enable_ranks is None or current_rank() in {int(r) for r in enable_ranks}


class _Out:
    """torch_musa's log sink: stdout, or ``output_dir/<tool>_rank<R>.log`` with should_log_to_file."""

    def __init__(self, tool: str, should_log_to_file: bool, output_dir: str | os.PathLike[str]) -> None:
        from ..capture.ranks import current_rank

        self.path: Path | None = None
        self._fh: TextIO | None = None
        if should_log_to_file:
            self.path = Path(output_dir) / f"{tool}_rank{current_rank()}.log"

    def open(self) -> None:
        if self.path is not None and self._fh is None:
            from ..plugin_types import prepare_output_dir

            prepare_output_dir(self.path.parent, option="output_dir")  # one-line UsageError if unusable
            try:
                self._fh = open(self.path, "a", encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"cannot open the log file {self.path} ({exc.strerror or exc}); "
                                 "choose another output_dir") from None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def write(self, text: str) -> None:
        if self._fh is not None:
            self._fh.write(text + "\n")
            self._fh.flush()
        else:
            sys.stdout.write(text + "\n")


class _DropEngineLines(logging.Filter):
    """Drops the engine's own NaN/Inf log record: the façade has logged it in torch_musa's format."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.args, tuple) and record.args[:1] == (_NANINF_MARKER,))


@contextmanager
def _engine_quiet() -> Iterator[None]:
    """While the engine ends a step, keep its log lines off the ``torchparity`` logger (which
    would print them to stderr, or to stdout under a user's logging config, next to the façade's)."""
    logger, flt = logging.getLogger("torchparity"), _DropEngineLines()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


# ---- CompareWithCPU ----------------------------------------------------------------------------


class _Engine(CompareWithReference):
    """The online compare, reporting its findings to the façade as they happen."""

    #: torch_musa advances steps only on ``step()`` (the stream still tells the optimizer phase)
    manual_steps = True

    def __init__(self, facade: "CompareWithCPU", **kw: Any) -> None:
        super().__init__(**kw)
        self.facade = facade

    def _log(self, level: int, text: str) -> None:
        """The engine's lines stay in :attr:`log_lines`; only the façade's sink prints (to stdout
        or, with ``should_log_to_file``, to the file only), so each error is logged once, in
        torch_musa's format. The summary and a case that could not be saved are passed on as is."""
        self.log_lines.append(text)
        if text.startswith(MARK_SUMMARY) or (text.startswith(MARK_ERROR) and " could not save " in text):
            self.facade._emit(text)

    def _selected(self, func: Any, module: str, phase: str = "") -> bool:
        ok = super()._selected(func, module, phase)
        if not ok and self.facade.white_list and any(
                _matches(p, func) for p in self.facade.white_list) and (
                self.target_ops is None or any(_matches(p, func) for p in self.target_ops)):
            self.facade._emit(f"{self.facade._label(module, str(func), phase)} is in white_list, pass")
        return ok

    def _check(self, func: Any, name: str, module: str, module_class: str | None, phase: str, *rest: Any) -> Any:
        label = self.facade._label(module, str(func), phase)
        if self.facade.verbose:
            self.facade._emit(f"{label} starts to run ...")
        before = (self.checked, len(self.naninf), len(self.failures))
        failure = super()._check(func, name, module, module_class, phase, *rest)
        for n in self.naninf[before[1]:]:
            self.facade._emit(f"[WARNING] {label} has NaN/Inf in its output ({n})")
        if failure is not None:
            self.facade._error_block(label, failure)
        elif self.checked > before[0] and len(self.failures) == before[2] and self.facade.verbose:
            self.facade._emit(f"{label} succeeds to pass CompareWithCPU test")
        return failure


def _matches(pattern: str, func: Any) -> bool:
    from ..online.compare import _op_matches

    return _op_matches([pattern], func)


class CompareWithCPU:
    """torch_musa's ``CompareWithCPU``: every op of the wrapped code against the CPU.

    Args:
        atol, rtol: tolerance of every dtype (torchparity's built-in judge).
        verbose: also log ``starts to run ...`` / ``succeeds to pass CompareWithCPU test`` per op.
        enabled: ``False``: do nothing at all.
        target_op: only these ops (``"torch.ops.aten.addmm"``, ``torch.ops.aten.addmm``, ``"aten.add*"``).
        white_list: never compare these ops (logged as ``... is in white_list, pass``).
        dump_error_data: save the first failing op as a failure case under ``output_dir`` and stop
            (raise :class:`~torchparity.online.compare.CompareFailure`).
        output_dir: where cases and (``should_log_to_file``) the per-rank log go.
        start_step, end_step: compare while ``start_step <= step_cnt < end_step``; ``step()``
            advances ``step_cnt``.
        should_log_to_file: log to ``output_dir/compare_with_cpu_rank<R>.log`` instead of stdout.
        enable_ranks: only these ranks compare (default: all).
        model: root module for module paths (default: the last :func:`open_module_tracker` model).
    """

    def __init__(self, atol: float = 0.001, rtol: float = 0.001, verbose: bool = False, enabled: bool = True,
                 target_op: Iterable[Any] | None = None, white_list: Iterable[Any] | None = None,
                 dump_error_data: bool = False, output_dir: str | os.PathLike[str] = ".", start_step: int = 0,
                 end_step: int | None = None, should_log_to_file: bool = False,
                 enable_ranks: Sequence[int] | None = None, model: torch.nn.Module | None = None) -> None:
        _check_steps(start_step, end_step)
        if atol < 0 or rtol < 0:
            raise UsageError(f"atol and rtol must be >= 0 (got atol={atol}, rtol={rtol})")
        self.atol, self.rtol, self.verbose = float(atol), float(rtol), bool(verbose)
        self.enabled = bool(enabled) and _rank_enabled(enable_ranks)
        self.target_op = [_op_pattern(p) for p in target_op] if target_op else None
        self.white_list = [_op_pattern(p) for p in white_list] if white_list else []
        self.dump_error_data = bool(dump_error_data)
        self.output_dir = Path(output_dir)
        self.start_step, self.end_step = int(start_step), end_step
        self.step_cnt = 0
        self.model = _tracked_model(model)
        self._prefixes = self.model is not None and (model is not None or self.model in _TRACKED)
        self._out = _Out("compare_with_cpu", should_log_to_file, output_dir)
        self.engine: _Engine | None = None

    # ---- results (the engine's) ------------------------------------------------------------
    @property
    def failures(self) -> list[OnlineFailure]:
        return self.engine.failures if self.engine is not None else []

    @property
    def log_path(self) -> Path | None:
        return self._out.path

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "CompareWithCPU":
        if not self.enabled:
            return self
        tol = {dt: (self.rtol, self.atol) for dt in DEFAULT_TOLERANCE}
        self.engine = _Engine(
            self, reference="cpu", checkers=[], judge=JudgeOptions(tolerance=tol), target_ops=self.target_op,
            ignore_ops=self.white_list, start_step=self.start_step,
            end_step=None if self.end_step is None else self.end_step - 1,
            on_failure="stop" if self.dump_error_data else "log",
            save_failures=self.output_dir if self.dump_error_data else None, max_saved=1, model=self.model)
        self._out.open()
        self._emit(_dt.datetime.now().strftime("%Y-%m-%d, %H:%M:%S"))
        self._step_header()
        try:
            self.engine.start()
        except BaseException:
            self._out.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.engine is None:
            return
        try:
            self.engine.stop()
        finally:
            self._out.close()

    def step(self) -> None:
        """Advance ``step_cnt`` (the compare is active while ``start_step <= step_cnt < end_step``)."""
        self.step_cnt += 1
        if self.engine is not None and self.engine.running:
            self.engine.step()
            self._step_header()

    # ---- log -------------------------------------------------------------------------------
    def _step_header(self) -> None:
        self._emit(f"-------------------------  step = {self.step_cnt}  ----------------------")

    def _emit(self, text: str) -> None:
        self._out.write(text)

    def _label(self, module: str, op: str, phase: str) -> str:
        prefix = ""
        if self._prefixes and self.model is not None:
            prefix = ModuleInfo.of(self.model, module).prefix + "/"
        return f"{prefix}{_op_label(op)}({phase})"

    def _error_block(self, label: str, f: OnlineFailure) -> None:
        lines = [_SEP, f"[ERROR] {label} fails to pass CompareWithCPU test", "....... input .........",
                 *[f"{d}, " for d in f.inputs], "", "...... output ........", *f.outputs, "",
                 "...... compare with cpu .......", "Tensor values are not close", f.reason]
        lines += [f"note: {n}" for n in f.notes]
        for w in f.worst:
            idx = ", ".join(str(i) for i in w["index"])
            lines.append(f"Element at index ({idx}) is not close: {w['device']}(device) vs {w['reference']}(cpu)")
        if f.case:
            lines.append(f"error data saved in {f.case}")
        lines.append(_SEP)
        self._emit("\n".join(lines))


# ---- NanInfTracker -----------------------------------------------------------------------------


class _Tracker(_EngineNanInfTracker):
    """The engine's NaN/Inf tracker with manual steps and a half-open step window."""

    def __init__(self, facade: "NanInfTracker", **kw: Any) -> None:
        self.facade = facade  # before the engine's first _reset_step
        super().__init__(**kw)

    steps_on_optimizer = False  # torch_musa: steps advance on step() only

    def _reset_step(self) -> None:
        super()._reset_step()
        f = getattr(self, "facade", None)
        if f is not None:
            self._active = f.start_step <= self.current_step and (f.end_step is None or self.current_step < f.end_step)

    def _end_step(self, raise_now: bool, advance: bool = True) -> None:
        n = len(self.findings)
        try:
            with _engine_quiet():
                super()._end_step(raise_now, advance)
        finally:
            for finding in self.findings[n:]:
                self.facade._warn(finding)


class NanInfTracker:
    """torch_musa's ``NanInfTracker``: find where NaN/Inf appear, on the device, without the CPU.

    Args:
        enabled: ``False``: do nothing.
        start_step, end_step: track while ``start_step <= step_cnt < end_step`` (``step()`` advances).
        should_log_to_file, output_dir: log to ``output_dir/nan_inf_tracker_rank<R>.log``.
        enable_ranks: only these ranks track.
        model: root module (default: the last :func:`open_module_tracker` model).

    Each step's first op that created a NaN/Inf from finite inputs (or, failing that, read one
    from outside: data, parameters) is logged as ``[WARNING] <modules>/torch.ops.aten.<op>(phase)
    ...``; the engine's findings are in :attr:`findings`.
    """

    def __init__(self, enabled: bool = True, start_step: int = 0, end_step: int | None = None,
                 should_log_to_file: bool = False, output_dir: str | os.PathLike[str] = ".",
                 enable_ranks: Sequence[int] | None = None, model: torch.nn.Module | None = None) -> None:
        _check_steps(start_step, end_step)
        self.enabled = bool(enabled) and _rank_enabled(enable_ranks)
        self.start_step, self.end_step = int(start_step), end_step
        self.step_cnt = 0
        self.model = _tracked_model(model)
        self._prefixes = self.model is not None and (model is not None or self.model in _TRACKED)
        self._out = _Out("nan_inf_tracker", should_log_to_file, output_dir)
        self.engine: _Tracker | None = None

    @property
    def findings(self) -> list[NanInfFinding]:
        return self.engine.findings if self.engine is not None else []

    @property
    def log_path(self) -> Path | None:
        return self._out.path

    def __enter__(self) -> "NanInfTracker":
        if not self.enabled:
            return self
        self.engine = _Tracker(self, model=self.model, on_failure="log")
        self._out.open()
        try:
            self.engine.start()
        except BaseException:
            self._out.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.engine is None:
            return
        try:
            self.engine.stop(_raise=False)
        finally:
            self._out.close()

    def step(self) -> None:
        """Advance ``step_cnt``; the step that ends is checked (one host read)."""
        self.step_cnt += 1
        if self.engine is not None and self.engine.running:
            self.engine.step()

    def _warn(self, f: NanInfFinding) -> None:
        prefix = ModuleInfo.of(self.model, f.module).prefix + "/" if self._prefixes and self.model is not None else ""
        what = ("produces " + f.value + " from finite inputs") if f.kind == "created" else \
            f"reads a tensor that already holds {f.value}"
        self._out.write(f"[WARNING] {prefix}{_op_label(f.op)}({f.phase}) {what} (step = {f.step}, {f.name})")
