"""The capture's per-record hot path: what it costs in Python calls, and that its fast-made
entries write exactly what the dataclass-made ones did (issue 15, item 3: less Python per op)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
import torch

from torchparity.capture.module_tracker import ModuleTracker
from torchparity.capture.options import DumpOptions
from torchparity.capture.session import CaptureSession, flat_args, flat_outputs
from torchparity.records import OpRecord, TensorEntry, encode_float


class _Sink:
    """A record sink that keeps the batches."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def submit(self, batch: Any) -> None:
        self.batches.append(batch)

    def end_step(self, step: int) -> None:
        pass

    def add_modules(self, modules: Any) -> None:
        pass

    def add_stack(self, step: int, rank: int, sid: int, frames: list[str]) -> None:
        pass


def _session(tmp_path: Any, level: str) -> CaptureSession:
    return CaptureSession(DumpOptions(path=str(tmp_path / "d"), level=level), _Sink(), ModuleTracker())


def _one_record(s: CaptureSession, level: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> OpRecord:
    """What a capture mode does for one call: name it, describe inputs and outputs, commit."""
    phase = s.phase()
    module, module_class, fwd, _ = s.module_info()
    assert s.wants("mm", "aten.mm.default", phase, module)
    rec = s.new_record(prefix="Aten", base="mm", op="aten.mm.default", level=level, phase=phase,
                       module=module, module_class=module_class, fwd=fwd, flags={})
    assert rec is not None
    rec.tensors = s.describe(flat_args((a, w, 2.0), {}), "input", rec.id, link=True, no_values={}, unmeasured={})
    outs = flat_outputs(out)
    rec.tensors += s.describe(outs, "output", rec.id, link=False, no_values={}, unmeasured={})
    s.note_outputs(rec.id, outs)
    s.commit(rec)
    return rec


@pytest.mark.parametrize("level,budget", [("aten", 22), ("api", 24)])
def test_session_python_calls_per_record(tmp_path: Any, level: str, budget: int) -> None:
    """The session's own Python work for one record (3 tensors, 1 scalar), statistics aside (they
    have their own path): Python function calls counted with sys.setprofile, deterministic on any
    machine. Before the hot-path work: 37 (aten) and 113 (api: call stacks are on by default there,
    and every frame of the stack ran a generator to test its file); after it 21 and 26; after
    the second pass (call-stack key by code object and instruction) 22 and 24."""
    s = _session(tmp_path, level)
    s._measure = lambda v, e: None  # type: ignore[method-assign]  # the statistics path is not counted here
    a, w, out = torch.randn(4, 16, 32), torch.randn(32, 32), torch.randn(4, 16, 32)
    calls: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name != "<lambda>":  # the stub above
            calls.append(frame.f_code.co_name)

    for i in range(3):  # the same call site each time, as in a training loop
        if i == 1:
            s.advance_step()  # counted: a record of a later step, its call stack seen at earlier steps
        if i == 2:
            sys.setprofile(prof)
        try:
            _one_record(s, level, a, w, out)  # first call: caches filled (dtype and device names, stack files)
        finally:
            sys.setprofile(None)
    calls = calls[1:]  # _one_record itself
    assert len(calls) <= budget, f"{len(calls)} Python calls per record: {calls}"


def _old_entry_json(io: str, arg: str, v: Any) -> dict[str, Any]:
    """What an entry wrote before the hot-path work (lists made from the tensor, scalars encoded)."""
    if isinstance(v, torch.Tensor):
        return {"io": io, "arg": arg, "kind": "tensor", "dtype": str(v.dtype).replace("torch.", ""),
                "shape": list(v.shape), "stride": list(v.stride()), "device": str(v.device),
                "requires_grad": v.requires_grad}
    if v is None:
        return {"io": io, "arg": arg, "kind": "none", "value": None}
    if isinstance(v, float) and not math.isfinite(v):
        v = str(v)
    elif isinstance(v, torch.dtype):
        v = str(v)
    elif isinstance(v, (list, tuple)):
        v = list(v)
    return {"io": io, "arg": arg, "kind": "scalar", "value": v}


def test_described_entries_write_what_they_wrote_before(tmp_path: Any) -> None:
    """Entries made by describe() keep torch.Size/stride tuples in memory; their JSON is the same
    as before, key order included, and the writer's encoder takes it."""
    from torchparity.dump.writer import _record_line

    s = _session(tmp_path, "aten")
    s._measure = lambda v, e: None  # type: ignore[method-assign]
    x = torch.randn(3, 5, requires_grad=True)
    values = [("0", x), ("1", x.detach().t()), ("2", torch.tensor(1.5)), ("3", float("nan")), ("4", float("-inf")),
              ("5", None), ("6", 3), ("7", True), ("8", "mean"), ("9", torch.float16), ("dim", [0, 1]),
              ("10", object())]  # not JSON-able: left out, as before
    entries = s.describe(values, "input", 0, link=False)
    assert [e.arg for e in entries] == [a for a, _ in values[:-1]]
    for (arg, v), e in zip(values, entries):
        assert e.to_json() == _old_entry_json("input", arg, v)
        line = _record_line({"e": e.to_json()})
        assert json.loads(line) == json.loads(json.dumps({"e": _old_entry_json("input", arg, v)}))
        assert list(json.loads(line)["e"]) == list(_old_entry_json("input", arg, v))  # key order


def test_fast_constructors_equal_the_dataclass() -> None:
    from torchparity.records import op_record, scalar_entry, tensor_entry

    t = tensor_entry("output", "0", "float32", [2, 3], [3, 1], "cpu", False)
    assert t == TensorEntry(io="output", arg="0", dtype="float32", shape=[2, 3], stride=[3, 1], device="cpu",
                            requires_grad=False)
    assert scalar_entry("input", "1", "scalar", 2) == TensorEntry(io="input", arg="1", kind="scalar", value=2)
    r = op_record(3, "Aten.mm.0.forward", "aten.mm.default", "aten", "forward", "", 0, 1, 0, None, None, None, {})
    assert r == OpRecord(id=3, name="Aten.mm.0.forward", op="aten.mm.default", level="aten", phase="forward",
                         module="", call_index=0, step=1, rank=0)
    r.tensors.append(t)  # its own list, not a shared default
    assert op_record(4, "n", "o", "aten", "forward", "", 0, 1, 0, None, None, None, {}).tensors == []


def test_stats_encoding_unchanged() -> None:
    from torchparity.records import tensor_entry

    e = tensor_entry("output", "0", "float32", (2,), (1,), "cpu", False)
    e.stats = {"max": float("inf"), "min": float("-inf"), "mean": float("nan"), "norm": 2.5, "nan": 1, "inf": None}
    assert e.to_json()["stats"] == {k: encode_float(v) for k, v in e.stats.items()}
    assert e.to_json()["stats"] == {"max": "Infinity", "min": "-Infinity", "mean": "NaN", "norm": 2.5, "nan": 1,
                                    "inf": None}


def test_host_stats_stay_rows_until_the_writer(tmp_path: Any) -> None:
    """On the training thread a CPU value's statistics stay a list (no dict per value); the
    batch hands them to the writer, which writes the same dict as before."""
    from torchparity.capture.stats import host_stats, stats_to_dict

    s = _session(tmp_path, "aten")
    x = torch.randn(64)
    x[3] = float("inf")
    (e,) = s.describe([("0", x)], "input", 0, link=False)
    assert e.stats is None  # not made on the training thread
    assert s._pending_stats == [host_stats(x)]
    rec = s.new_record(prefix="Aten", base="abs", op="aten.abs.default", level="aten", phase="forward",
                       module="", module_class=None, flags={})
    rec.tensors = [e]
    s.commit(rec)
    s.flush()
    batch = s.writer.batches[-1]
    assert batch.stat_slots == [e] and batch.stats.tolist() == [host_stats(x)]  # what the writer reads
    assert stats_to_dict(batch.stats.tolist()[0])["inf"] == 1


def test_stack_ids_as_spelled_by_line(tmp_path: Any) -> None:
    """Stacks keyed by (code, instruction) intern by their file:line text: two calls on one line
    share an id, ids restart each step, and every new stack is reported once per step."""
    from torchparity.capture.stacks import StackTable

    seen: list[tuple[int, list[str]]] = []
    t = StackTable(lambda sid, frames: seen.append((sid, frames)))

    def site() -> int | None:
        return t.current()

    def user() -> tuple[Any, Any, Any]:
        a, b = site(), site()  # one line, two instructions
        c = site()
        return a, b, c

    assert [user() for _ in range(2)] == [(0, 0, 1)] * 2  # one call site of user(): the same ids
    assert len(seen) == 2 and seen[0][1][0].endswith(f":{user.__code__.co_firstlineno + 1} in user")
    assert seen[1][1][0].endswith(f":{user.__code__.co_firstlineno + 2} in user")
    t.reset()
    assert [user() for _ in range(2)] == [(0, 0, 1)] * 2
    assert len(seen) == 4 and [(i, f[0]) for i, f in seen[2:]] == [(i, f[0]) for i, f in seen[:2]]


def test_aten_mode_python_calls_per_record_with_statistics(tmp_path: Any) -> None:
    """The whole aten-level path of one recorded kernel call, statistics included: the op
    stream's dispatch, the consumer, naming, describing and measuring (host statistics), the
    commit. Python function calls counted with sys.setprofile (deterministic; torch's own calls
    on the way to ``__torch_dispatch__`` are counted too, 8 per op on torch 2.13). Session 8
    (bench/results/session8/launch.md): 41 per record before, 21.5 after (flat_args without a
    generator per list argument, the statistics-mode measurement inlined in ``describe``, the
    common phase / busy / module / filter / uninitialised / note_outputs / commit steps inlined)."""
    from torchparity.capture.aten_mode import AtenCaptureMode

    s = _session(tmp_path, "aten")
    a, w = torch.randn(64, 32), torch.randn(32, 32)
    calls: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    with AtenCaptureMode(s):
        for i in range(3):  # caches filled by the first calls
            if i == 2:
                sys.setprofile(prof)
            try:
                y = torch.mm(a, w)  # two inputs measured fresh (first step), one output
                torch.relu(y)  # its input's statistics reused, one output measured
            finally:
                sys.setprofile(None)
    per_record = len(calls) / 2
    assert s._pending and s._pending[-1].op == "aten.relu.default"
    assert per_record <= 23, f"{per_record} Python calls per record: {calls}"
