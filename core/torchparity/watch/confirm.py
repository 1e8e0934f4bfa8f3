"""Confirm a trigger: restore the snapshot, replay the steps before the bad one (checking bitwise
that they reproduce), re-run the bad step under the full dump, the NaN/Inf tracker and (with a
reference) online compare, and save a replay case of the culprit op."""

from __future__ import annotations

import contextlib
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..capture.op_stream import OpCall, OpConsumer
from ..online.case import safe_name, save_case
from .snapshots import History, StepRecord, restore_state, set_rng_state


def bits(x: float | None) -> bytes | None:
    """The exact bits of a step's value (NaN payloads included)."""
    return None if x is None else struct.pack("<d", x)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _finite(ts: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts if t.is_floating_point() or t.is_complex())


class CaseGrabber(OpConsumer):
    """While the bad step is re-run: keep the arguments and outputs of the first ops that produce a
    NaN/Inf from finite inputs (one host read per op: the re-run is the expensive tier)."""

    needs_modules = True

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self.sites: list[dict[str, Any]] = []

    def on_op(self, call: OpCall, args: tuple, kwargs: dict, run: Callable[..., Any]) -> Any:
        if call.name is None or len(self.sites) >= self.limit:
            return run(*args, **kwargs)
        ins = _tensors((args, kwargs))
        ok_in = _finite(ins)
        saved = None
        if ok_in:  # inputs as they were before the op (it may write them)
            saved = (_cpu(args), _cpu(kwargs)) if call.info.writes else (args, kwargs)
        out = run(*args, **kwargs)
        if ok_in:
            outs = _tensors(out)
            if outs and not _finite(outs):
                path, cls = call.where()
                a, k = saved if call.info.writes else (_cpu(args), _cpu(kwargs))
                self.sites.append({"name": call.name, "op": call.info.op, "module": path, "module_class": cls,
                                   "phase": call.phase, "args": a, "kwargs": k, "outs": [t.detach().cpu() for t in outs]})
        return out


def _cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


@dataclass
class Confirmation:
    """What the replay found (see docs/watch.md for the report built from it)."""

    reproducible: bool
    replayed: list[dict[str, Any]] = field(default_factory=list)  # steps before the bad one
    rerun: dict[str, Any] = field(default_factory=dict)  # the bad step: first run vs re-run
    root_cause: dict[str, Any] = field(default_factory=dict)
    dump: str | None = None
    case: str | None = None
    seconds: float = 0.0


def _val(x: float | None) -> Any:
    return x if x is None or math.isfinite(x) else str(x)


def confirm(history: History, execute: Callable[[StepRecord], tuple[float, float | None]], model: torch.nn.Module,
            optimizer: Any, scaler: Any, out: Path, rank: int, reference: str | None) -> Confirmation:
    """Replay from the snapshot to the bad step (the last one kept) and judge it (see module doc)."""
    import torchparity
    from ..online.naninf import NanInfTracker

    t0 = time.perf_counter()
    assert history.snapshot is not None
    restore_state(history.snapshot, model, optimizer, scaler)
    *before, bad = history.steps
    replayed = []
    for rec in before:
        set_rng_state(rec.rng)
        loss, norm = execute(rec)
        replayed.append({"step": rec.step, "loss": _val(rec.loss), "replayed_loss": _val(loss),
                         "same": bits(loss) == bits(rec.loss) and bits(norm) == bits(rec.norm)})
    set_rng_state(bad.rng)
    dump_dir = out / "dump"
    cases = out / "cases"
    grab = CaseGrabber()
    tracker = NanInfTracker(model, on_failure="log")
    compare = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(torchparity.dump(str(dump_dir), level="aten", mode="statistics", model=model))
        if reference is not None:
            compare = stack.enter_context(torchparity.CompareWithReference(reference, model=model, save_failures=cases))
        stack.enter_context(tracker)
        stack.enter_context(torchparity.op_stream().attached(grab, model))
        loss, norm = execute(bad)
    same = bits(loss) == bits(bad.loss) and bits(norm) == bits(bad.norm)
    root: dict[str, Any] = {"name": None, "op": None, "module": None, "phase": None, "source": None}
    case = None
    first = tracker.first
    if first is not None:
        root = {"name": first.name, "op": first.op, "module": first.module, "phase": first.phase, "source": "naninf"}
        site = next((s for s in grab.sites if s["name"] == first.name and s["phase"] == first.phase),
                    grab.sites[0] if grab.sites else None)
        if site is not None:
            case = str(_save_site(site, cases, bad.step, rank))
    elif compare is not None and compare.first_failure is not None:
        f = compare.first_failure
        root = {"name": f.name, "op": f.op, "module": f.module, "phase": f.phase, "source": "compare"}
        case = f.case
    return Confirmation(
        reproducible=same, replayed=replayed,
        rerun={"step": bad.step, "loss": _val(bad.loss), "rerun_loss": _val(loss), "grad_norm": _val(bad.norm),
               "rerun_grad_norm": _val(norm)},
        root_cause=root, dump=str(dump_dir), case=case, seconds=time.perf_counter() - t0)


def _save_site(site: dict[str, Any], cases: Path, step: int, rank: int) -> Path:
    meta = {"name": site["name"], "op": site["op"], "module": site["module"], "module_class": site["module_class"],
            "step": step, "rank": rank, "phase": site["phase"], "verdict": "error",
            "reason": "produced NaN/Inf from finite inputs (torchparity.watch re-run)", "checker": "watch",
            "metrics": {}, "worst": [], "notes": [],
            "device": {"type": site["outs"][0].device.type if site["outs"] else "cpu", "backend": None,
                       "emulated_dtype": None},
            "reference": "cpu", "torch_version": torch.__version__}
    return save_case(cases / safe_name(f"step{step}_rank{rank}_{site['name']}"), meta, site["args"], site["kwargs"],
                     site["outs"])
