"""msprobe-compatible entry points over torchparity's engine.

Replace ``from msprobe.pytorch import PrecisionDebugger, compare, compare_distributed`` with
``from torchparity.compat.msprobe import ...``; the same ``config.json`` and calls work::

    debugger = PrecisionDebugger(config_path="./config.json", dump_path="./npu_dump")
    debugger.start(); ...; debugger.stop(); debugger.step()
    compare({"npu_json_path": "./npu_dump/dump.json", "bench_json_path": "./bench_dump/dump.json",
             "stack_json_path": "./npu_dump/stack.json", "is_print_compare_log": True},
            output_path="./output", stack_mode=True)
    compare_distributed("./npu_dump/step0", "./gpu_dump/step0", "./output")

What each ``config.json`` key does here:

* ``task``: ``statistics`` / ``tensor`` → the dump mode; ``structure`` → a module-level dump (the
  module tree and each module's records); ``overflow_check`` → a statistics
  dump scanned by the overflow checker at every ``step()``/``stop()``: the overflowing ops (finite
  inputs, NaN/Inf output) are logged and written to ``DUMP/overflow.json``; ``overflow_nums``
  (default 1, ``-1`` = unlimited) is how many overflowing ops are reported before the dump stops
  recording (msprobe stops dumping after that many);
* ``seed`` / ``is_deterministic``: applied when the debugger is created (``torch.manual_seed``
  and every device generator; ``torch.use_deterministic_algorithms``), like msprobe;
* ``rank``, ``step``, ``level`` (L0 module, L1 api, L2 aten, mix), ``scope``, ``list`` (op
  names; ``"distributed"`` = collectives only), ``data_mode``, ``summary_mode`` (``md5``):
  the dump filters (:func:`torchparity.dump.options.from_msprobe`); ``"list": ["distributed"]``
  records only ``torch.distributed`` APIs and c10d collectives;
* ``dump_path`` argument: overrides the file's ``dump_path``;
* ``task: grad_probe`` (seed 004): ``debugger.monitor(model)`` records the gradients at every
  optimizer step with :class:`~torchparity.gradients.GradMonitor` in msprobe's layout
  (``grad_level``, ``param_list``, ``bounds``, ``rank``, ``step``: :mod:`.msprobe_grad`);
  :class:`GradComparator` compares two such dumps.

Steps advance only on ``debugger.step()`` (not on ``optimizer.step()``, unlike a native dump).

Dumps are torchparity dumps (``DUMP/step{S}/rank{R}/records.jsonl``); :func:`compare` accepts
those and msprobe dumps (``dump.json``) on either side.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import weakref
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError
from .msprobe_grad import GradComparator

log = logging.getLogger("torchparity")

__all__ = ["PrecisionDebugger", "GradComparator", "compare", "compare_distributed", "graph"]

#: msprobe's communication API names (seed 001, "通信类API支持列表") and the aten names they reach.
DISTRIBUTED_OPS = ("send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "gather", "isend", "irecv",
                   "scatter", "reduce_scatter", "_reduce_scatter_base", "_all_gather_base")


def _read_config(config_path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(config_path)
    if not p.is_file():
        raise UsageError(f"msprobe config {p} does not exist")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{p}: expected a JSON object")
    return cfg


def _pause(session: Any) -> None:
    """Record nothing until resumed: no op records, no module records (full or light tier)."""
    session.enabled_step = session.light_step = False


class PrecisionDebugger:
    """msprobe's ``PrecisionDebugger``: ``start()`` / ``stop()`` / ``step()`` around the code to dump."""

    def __init__(self, config_path: str | os.PathLike[str] | None = None, dump_path: str | None = None,
                 task: str | None = None, level: str | None = None, model: Any = None, step: list | None = None,
                 **_: Any) -> None:
        from ..dump.options import from_msprobe

        cfg = _read_config(config_path) if config_path is not None else {"task": "statistics"}
        if task is not None:
            cfg["task"] = task
        if level is not None:
            cfg["level"] = level
        if step is not None:
            cfg["step"] = step
        if dump_path is not None:
            cfg["dump_path"] = str(dump_path)
        self.config = cfg
        self.task = cfg.get("task", "statistics")
        self.model = model
        self._dumper: Any = None
        self._grad_monitor: Any = None
        self.overflows: list[dict[str, Any]] = []
        if self.task == "grad_probe":  # seed 004: monitor(model), a GradMonitor (msprobe_grad.py)
            from .msprobe_grad import grad_probe_settings

            self.grad_settings = grad_probe_settings(cfg, str(config_path or "PrecisionDebugger"))
            self.dump_path = self.grad_settings["output_dir"]
            self.options: dict[str, Any] = {}
            self.overflow_nums = 0
            self._apply_seed(cfg)
            return
        section = cfg.get(self.task) or {}
        lst = [str(x) for x in section.get("list") or []]
        if "distributed" in lst:
            # msprobe: "list": ["distributed"] dumps only the communication APIs
            section = dict(section, list=[x for x in lst if x != "distributed"])
            cfg = dict(cfg, **{self.task: section})
        opts = from_msprobe({k: v for k, v in cfg.items()}, str(config_path or "PrecisionDebugger"))
        if "distributed" in lst:
            opts["ops"] = (opts.get("ops") or []) + [r"re:^(?:torch\.distributed\.|c10d\.|_c10d_functional\.|c10d_functional\.)"]
        opts.setdefault("path", "./dump_path")
        if self.task == "overflow_check":
            opts["mode"] = "statistics"
        self.overflow_nums = int((cfg.get("overflow_check") or {}).get("overflow_nums", 1))
        self.dump_path = opts["path"]
        self.options = opts
        self._apply_seed(cfg)

    def _apply_seed(self, cfg: dict[str, Any]) -> None:
        if cfg.get("seed") is not None:
            _seed_everything(int(cfg["seed"]))
        if cfg.get("is_deterministic"):
            import torch

            torch.use_deterministic_algorithms(True, warn_only=True)

    # ---- msprobe API --------------------------------------------------------------------------
    def monitor(self, model: Any) -> None:
        """``task: grad_probe``: record ``model``'s gradients at every optimizer step (seed 004)."""
        if self.task != "grad_probe":
            raise UsageError(f"PrecisionDebugger.monitor is for task grad_probe; this config's task is {self.task!r}")
        from .msprobe_grad import start_grad_probe

        if self._grad_monitor is not None:
            self._grad_monitor.stop()
        self._grad_monitor = start_grad_probe(model, self.grad_settings)
        if self._grad_monitor is not None:
            _OPEN.add(self)

    def start(self, model: Any = None) -> None:
        """Start (or resume) dumping."""
        if self.task == "grad_probe":
            return  # the gradient probe runs from monitor(model) on; steps are optimizer steps
        if self._dumper is None:
            self._dumper = _msprobe_dumper(model or self.model, self.options)
            _OPEN.add(self)
        if self._dumper.session is None:
            self._dumper.start()
        else:
            self._resume()

    def stop(self) -> None:
        """Pause dumping (``start()`` resumes into the same step); ``grad_probe``: end monitoring."""
        if self._grad_monitor is not None:
            self.close()
        if self._dumper is not None and self._dumper.session is not None:
            self._dumper._finish_step_records()  # backward records of the api/module levels
            _pause(self._dumper.session)
            self._dumper.flush()

    def step(self) -> None:
        """End the step: what follows is written under the next ``step{S}`` directory.

        The only thing that advances the step (``optimizer.step()`` does not, unlike a native
        ``torchparity.dump``): the seed's loop ``start / forward / backward / optimizer.step() /
        stop / step`` writes ``step0``, ``step1``, ``step2``."""
        if self._dumper is None or self._dumper.session is None:
            return
        was = self._dumper.session.enabled_step or self._dumper.session.module_step
        closed = self._dumper.session.step
        self._dumper.step()
        self._dumper.flush()  # the closed step's files and footer are on disk
        self._check_overflow([closed])
        if not was:
            _pause(self._dumper.session)

    def close(self) -> None:
        """Finish the dump (also done at interpreter exit)."""
        _OPEN.discard(self)
        if self._grad_monitor is not None:
            self._grad_monitor.stop()
            self._grad_monitor = None
        if self._dumper is not None:
            last = self._dumper.session.step if self._dumper.session is not None else None
            self._dumper.stop()
            if last is not None:
                self._check_overflow([last])

    def _resume(self) -> None:  # the step's own schedule again (DumpOptions steps/every/light)
        s = self._dumper.session
        s.enabled_step = s._step_enabled()

    # ---- overflow_check -------------------------------------------------------------------------
    def _check_overflow(self, steps: list[int]) -> None:
        """Scan the given *closed* steps (their footers are written) for overflowing ops.

        Only closed steps are read: the step still being recorded has no ``footer.json`` yet, and
        reading it would report the dump as damaged ("not closed cleanly") after a normal stop."""
        if self.task != "overflow_check" or self._dumper is None:
            return
        from ..cli.overflow_cmd import analyse
        from ..plugins import get_registry

        root = Path(self.dump_path)
        rank = self._dumper.session._rank if self._dumper.session is not None else None
        for s in steps:
            if not any((root / f"step{s}").glob("rank*/footer.json")):
                continue  # nothing recorded in that step (filtered out, or paused throughout)
            report = analyse(root, step=s, rank=rank, checker=get_registry().get("checker", "overflow"))
            self._note_overflows(report)
        root.mkdir(parents=True, exist_ok=True)
        Path(root, "overflow.json").write_text(
            json.dumps({"overflow_nums": self.overflow_nums, "overflows": self.overflows}, indent=2) + "\n",
            encoding="utf-8")

    def _note_overflows(self, report: dict[str, Any]) -> None:
        ids = {(o["step"], o["rank"], o["record_id"]) for o in self.overflows}
        for f in report["first_critical"]:
            if (f["step"], f["rank"], f["record_id"]) not in ids:
                self.overflows.append(f)
                log.warning("[msprobe overflow] %s (%s) in %s, step %s rank %s: %s", f["name"], f["op"],
                            f["module"] or "(top level)", f["step"], f["rank"], f["reason"])
        if self.overflow_nums != -1 and len(self.overflows) >= self.overflow_nums and self._dumper.session is not None:
            self._dumper.session.options.steps = []  # msprobe stops dumping after overflow_nums overflows
            _pause(self._dumper.session)


#: debuggers started and not closed: closed at interpreter exit (before the dumps they hold), so
#: the last step is scanned and ``overflow.json`` written even without ``close()``
_OPEN: "weakref.WeakSet[PrecisionDebugger]" = weakref.WeakSet()


@atexit.register
def _close_open_debuggers() -> None:
    for d in list(_OPEN):
        try:
            d.close()
        except Exception as exc:  # pragma: no cover - never fail the interpreter's exit
            log.error("msprobe façade: closing the dump at exit failed: %s", exc)


def _msprobe_dumper(model: Any, options: dict[str, Any]) -> Any:
    """A :class:`~torchparity.dump.api.Dumper` whose steps advance only on ``debugger.step()``.

    A native dump also ends the step on ``optimizer.step()``; msprobe counts steps by
    ``debugger.step()`` alone, and doing both numbered the seed's loop step0, step2, step4."""
    from ..dump.api import Dumper, dump

    class _MsprobeDumper(Dumper):
        def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.session is not None:
                self.session.in_optimizer = False  # the optimizer's ops are over; no step change

    plain = dump(**options)  # validates the options as the native API does
    return _MsprobeDumper(plain.options, model=model)


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    torch.manual_seed(seed)


def _dump_dir(path: str | os.PathLike[str] | None, key: str) -> Path:
    if not path:
        raise UsageError(f"compare: input_param needs '{key}'")
    p = Path(path)
    if p.name in ("dump.json", "stack.json", "construct.json") and p.parent.is_dir():
        return p.parent  # msprobe dump or a torchparity dump named as msprobe would
    if p.is_dir():
        return p
    raise UsageError(f"compare: {key}={str(path)!r} does not exist")


def compare(input_param: Mapping[str, Any], output_path: str | os.PathLike[str], stack_mode: bool = False,
            auto_analyze: bool = True, fuzzy_match: bool = False, **_: Any) -> Any:
    """msprobe's ``compare``: writes ``compare_result_{timestamp}.xlsx`` and ``advisor_{timestamp}.txt``.

    ``npu_json_path`` / ``bench_json_path`` point at ``dump.json`` files or dump directories
    (msprobe or torchparity dumps). ``stack_mode`` adds the call-stack column
    (``NPU_Stack_Info``); ``is_print_compare_log`` prints the console summary; ``auto_analyze``
    writes the advisor file. Returns the :class:`~torchparity.results.CompareResult`.
    """
    from ..config import parse_config
    from ..plugins import build_registry
    import torchparity

    if not isinstance(input_param, Mapping):
        raise UsageError("compare: input_param must be a dict with npu_json_path and bench_json_path")
    dev = _dump_dir(input_param.get("npu_json_path") or input_param.get("npu_path"), "npu_json_path")
    ben = _dump_dir(input_param.get("bench_json_path") or input_param.get("bench_path"), "bench_json_path")
    stamp = time.strftime("%Y%m%d%H%M%S")
    xlsx_name, advisor_name = f"compare_result_{stamp}.xlsx", f"advisor_{stamp}.txt"
    formats = ["xlsx"] + (["advisor"] if auto_analyze else []) + (["log"] if input_param.get("is_print_compare_log", True) else [])
    reg = build_registry(parse_config({
        "reporters": [{"xlsx": {"filename": xlsx_name, "include_stack": bool(stack_mode)}},
                      {"advisor": {"filename": advisor_name}}, "log", "json"],
    }))
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    result = torchparity.compare(dev, ben, plugins=reg)  # reports are written below
    if stack_mode:
        _attach_stacks(result, dev)
    result.output_dir = out
    for name in formats:
        reg.get("reporter", name).write(result, out)
    return result


def _attach_stacks(result: Any, dev: Path) -> None:
    """Add the device side's call stack to every compare row (msprobe's ``NPU_Stack_Info``).

    torchparity's compare rows do not carry the stack themselves (they drop ``d_stack``); the
    device dump has it, keyed by (step, rank, record id)."""
    from ..dump.reader import open_dump

    rows = result.rows
    if rows is None or rows.empty or "device_record_id" not in rows.columns:
        return
    reader = open_dump(dev)
    frame = reader.frame()
    if "stack" not in frame.columns:
        return
    ids = frame[["step", "rank", "record_id", "stack"]].drop_duplicates(["step", "rank", "record_id"])
    cache: dict[tuple[int, int], dict[int, list[str]]] = {}
    by_key: dict[tuple[int, int, int], list[str]] = {}
    for step, rank, rid, sid in ids.itertuples(index=False, name=None):
        if sid is None or sid != sid:
            continue
        key = (int(step), int(rank))
        if key not in cache:
            try:
                cache[key] = reader.stacks(*key)
            except Exception:
                cache[key] = {}
        frames = cache[key].get(int(sid)) if not isinstance(sid, (list, tuple)) else list(sid)
        if frames:
            by_key[(int(step), int(rank), int(rid))] = frames
    steps = rows["step"] if "step" in rows.columns else 0
    ranks = rows["rank"] if "rank" in rows.columns else 0
    import pandas as pd

    keys = zip(pd.Series(steps, index=rows.index), pd.Series(ranks, index=rows.index), rows["device_record_id"])
    result.rows = rows.assign(stack=[by_key.get((int(s), int(r), int(i))) if i == i else None for s, r, i in keys])


def compare_distributed(npu_dump_dir: str | os.PathLike[str], bench_dump_dir: str | os.PathLike[str],
                        output_path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """msprobe's ``compare_distributed``: step-level directories holding the same ``rank*`` folders.

    Every rank is compared (in parallel processes); reports go to ``output_path``.
    """
    import torchparity

    a, b = Path(npu_dump_dir), Path(bench_dump_dir)
    for p in (a, b):
        if not p.is_dir():
            raise UsageError(f"compare_distributed: {p} is not a directory (pass the step level: DUMP/step0)")
    ra = sorted(x.name for x in a.iterdir() if x.is_dir() and x.name.startswith("rank"))
    rb = sorted(x.name for x in b.iterdir() if x.is_dir() and x.name.startswith("rank"))
    if not ra or ra != rb:
        raise UsageError(f"compare_distributed: both directories must hold the same rank folders; "
                         f"{a} has {ra or 'none'}, {b} has {rb or 'none'}")
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    return torchparity.compare(a, b, output_dir=out, formats=kwargs.get("formats", "xlsx,advisor,json"))


# ---- graph (seed 003: msprobe -f pytorch graph -i compare.json -o out) -------------------------


def graph(input_param: str | os.PathLike[str] | dict[str, Any], output_path: str | os.PathLike[str],
          layer_mapping: str | os.PathLike[str] | None = None, overflow_check: bool = False,
          fuzzy_match: bool = False) -> list[Path]:
    """msprobe's hierarchical graph build/compare, done by :mod:`torchparity.graph`.

    ``input_param`` is the seed's ``compare.json`` (or its dict): ``npu_path`` (required),
    ``bench_path`` (omit to only build the graph), ``is_print_compare_log``. A path may be one
    rank directory, a step directory holding ``rank*`` folders (every rank), or a dump root
    holding ``step*`` folders (every step and rank) — torchparity or msprobe dumps. For each
    (step, rank) one self-contained page ``compare_{timestamp}_step{S}_rank{R}.vis.html`` (or
    ``build_…``) and its ``.vis.json`` are written; msprobe writes a ``.vis.db`` for its
    TensorBoard plugin instead. Overflow levels are always marked (``overflow_check`` is
    accepted for compatibility); ``fuzzy_match`` is accepted too: torchparity's matching always
    falls back to shapes and order. Returns the pages written.
    """
    import time as _time

    from ..dump.reader import open_dump
    from ..graph import build_graph, compare_graphs, write_html, write_json

    if isinstance(input_param, (str, os.PathLike)):
        p = Path(input_param)
        if not p.is_file():
            raise UsageError(f"graph: {p} does not exist; pass the compare.json with npu_path (and bench_path)")
        try:
            input_param = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"graph: {p} is not valid JSON ({exc})") from None
    if not isinstance(input_param, dict) or "npu_path" not in input_param:
        raise UsageError("graph: the input needs 'npu_path' (and 'bench_path' to compare), as in msprobe's compare.json")
    unknown = sorted(set(input_param) - {"npu_path", "bench_path", "is_print_compare_log", "parallel_merge"})
    if unknown:
        raise UsageError(f"graph: unknown key(s) {', '.join(unknown)} in the input")
    if input_param.get("parallel_merge"):
        raise UsageError("graph: parallel_merge (graphs of different TP/PP splits) is not supported; compare "
                         "dumps of the same split")
    npu, bench = input_param["npu_path"], input_param.get("bench_path")
    verbose = bool(input_param.get("is_print_compare_log", True))
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _time.strftime("%Y%m%d%H%M%S")
    kind = "compare" if bench else "build"
    written: list[Path] = []
    for u in open_dump(npu).units:
        if bench:
            g = compare_graphs(npu, bench, step=u.step, rank=u.rank, layer_mapping=layer_mapping)
        else:
            g = build_graph(npu, step=u.step, rank=u.rank)
        page = out / f"{kind}_{stamp}_step{u.step}_rank{u.rank}.vis.html"
        write_html(g, page)
        write_json(g, page.with_suffix("").with_suffix(".vis.json"))
        written.append(page)
        if verbose:
            print(f"[msprobe graph] step {u.step} rank {u.rank}: {page}")
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m torchparity.compat.msprobe -f pytorch graph -i compare.json -o out`` — the
    seed's command line with ``msprobe`` replaced. Also ``compare -tp … -gp … -o …``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m torchparity.compat.msprobe")
    ap.add_argument("-f", "--framework", default="pytorch", choices=["pytorch"])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("graph", help="build or compare the hierarchical graph (seed 003)")
    g.add_argument("-i", "--input_path", required=True)
    g.add_argument("-o", "--output_path", required=True)
    g.add_argument("-lm", "--layer_mapping", nargs="?", const=None, default=None)
    g.add_argument("-oc", "--overflow_check", action="store_true")
    g.add_argument("-fm", "--fuzzy_match", action="store_true")
    c = sub.add_parser("compare", help="compare two dumps (seed 001)")
    c.add_argument("-tp", "--target_path", required=True)
    c.add_argument("-gp", "--golden_path", required=True)
    c.add_argument("-o", "--output_path", required=True)
    c.add_argument("-s", "--stack_mode", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "graph":
            graph(a.input_path, a.output_path, layer_mapping=a.layer_mapping, overflow_check=a.overflow_check,
                  fuzzy_match=a.fuzzy_match)
        else:
            compare({"npu_json_path": a.target_path, "bench_json_path": a.golden_path}, a.output_path,
                    stack_mode=a.stack_mode)
    except UsageError as exc:
        print(f"torchparity: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
