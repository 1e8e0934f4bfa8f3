"""The writer's records.jsonl encoding (dump/record_json.py): the same bytes as
``json.dumps(record.to_json())`` for every kind of entry, with less Python work per entry."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from torchparity.capture.batch import Batch
from torchparity.capture.session import StatRows
from torchparity.dump.record_json import encode_lines, stats_dict
from torchparity.dump.writer import DumpWriter
from torchparity.records import OpRecord, TensorEntry

_ROWS = [[1.5, -2.0, 0.25, 3.0, 0.0, 0.0], [math.nan, math.nan, math.nan, math.nan, 4.0, 0.0],
         [math.inf, -1.0, math.inf, math.inf, 0.0, 2.0], [1e308, 1e308, 1e308, math.inf, 0.0, 0.0],
         [-0.0, -0.0, -0.0, 0.0, 0.0, 0.0], [1e308, 1e308, 1e308, 1e308, 0.0, 0.0]]


def _records(rows: list[list[float]], ready: set[int]) -> list[OpRecord]:
    t = lambda **kw: TensorEntry(io="input", arg="0", dtype="float32", shape=torch.Size([2, 3]), stride=(3, 1),  # noqa: E731
                                 device="cpu", requires_grad=False, **kw)
    recs = []
    for i, row in enumerate(rows):
        recs.append(OpRecord(i, f"Aten.mm.{i}.forward", "aten.mm.default", "aten", "forward", "m", i, 0, 0,
                             module_class="Lin" if i % 2 else None, fwd=None if i % 3 else 7, stack=i,
                             tensors=[t(stats=stats_dict(row, ready), producer=[0, 1] if i else None),
                                      t(md5="abc" if i % 2 else None, file="tensors/x.safetensors" if i == 2 else None,
                                        key="k" if i == 2 else None),
                                      TensorEntry(io="input", arg="alpha", kind="scalar", value=2.5),
                                      TensorEntry(io="input", arg="1", kind="none"),
                                      TensorEntry(io="input", arg="2", kind="scalar", value="inf")],
                             flags={"inplace": True} if i % 2 else {}))
    # statistics dicts not made from a row (another producer's): the general way
    recs.append(OpRecord(9, "Aten.x.0.forward", "aten.x.default", "aten", "forward", "", 0, 0, 0,
                         tensors=[t(stats={"max": math.nan, "min": None, "mean": 1, "norm": math.inf, "nan": 1, "inf": 1})]))
    return recs


def test_lines_equal_the_records_to_json() -> None:
    ready: set[int] = set()
    recs = _records(_ROWS, ready)
    want = "".join(json.dumps(r.to_json(), separators=(",", ":"), allow_nan=False) + "\n" for r in recs).encode()
    got = encode_lines(recs, ready)
    assert json.loads(b"[" + got.replace(b"\n", b",").rstrip(b",") + b"]") == \
        [json.loads(x) for x in want.splitlines()]
    import orjson

    assert got == b"".join(orjson.dumps(r.to_json()) + b"\n" for r in recs)  # byte for byte
    # only rows of four finite values are taken as they are (-0.0 included; an overflowing sum is not)
    assert sum(1 for r in recs for e in r.tensors if id(e.stats) in ready) == 2


def test_writer_calls_per_entry(tmp_path: Path) -> None:
    """The writer thread's Python calls for a batch of records whose statistics are finite
    host rows (the common case): 100 records, 2 tensor entries each. Before record_json: 12.07
    per record (to_json, per entry its to_json, the stats dict comprehension and 2 encode_float
    calls, the line); after: 6.08 (record_dict, 2 entry_dict, 2 stats_dict, the batch's own)."""
    w = DumpWriter(tmp_path / "d", {"tool_version": "test"}, fsync=False, summaries="off")
    t = lambda: TensorEntry(io="input", arg="0", dtype="float32", shape=(4,), stride=(1,), device="cpu",  # noqa: E731
                            requires_grad=False)
    recs = [OpRecord(i, f"Aten.mm.{i}.forward", "aten.mm.default", "aten", "forward", "", i, 0, 0,
                     tensors=[t(), t()]) for i in range(100)]
    slots = [e for r in recs for e in r.tensors]
    rows = StatRows([[1.0, 0.0, 0.5, 2.0, 0.0, 0.0] for _ in slots])
    calls: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    batch = Batch(0, 0, recs, slots, rows)
    w._rank_files(0, 0)  # the step's files opened outside the count
    sys.setprofile(prof)
    try:
        w._write_batch(batch)
    finally:
        sys.setprofile(None)
    w.close()
    per_record = len(calls) / len(recs)
    assert per_record <= 6.5, f"{per_record} Python calls per record"
    lines = (tmp_path / "d" / "step0" / "rank0" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 100 and json.loads(lines[5])["tensors"][1]["stats"] == \
        {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0, "nan": 0, "inf": 0}
