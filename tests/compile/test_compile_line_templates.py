"""A compiled capture's repeated steps are written from pre-encoded lines (dump/record_json.py
LineTemplates): the same bytes as record objects give, for every step, with non-finite
statistics and with a graph that changes between steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from torchparity.compile import compile_backend
from torchparity.dump import record_json
from torchparity.records import op_record, tensor_entry

from tests.compile.conftest import train_compiled

pytestmark = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 2),
                                reason="the compile backend needs torch >= 2.2 (AOTAutograd node metadata)")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.ln(self.fc1(x))))


def _run(root: Path, steps: int = 4) -> None:
    torch.manual_seed(0)
    model = Small()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

    def loss_of(run, i):
        xi = x.clone()
        if i == 2:  # an Inf at step 2: non-finite statistics (strings in the JSON)
            xi[0, 0] = float("inf")
        return run(xi).square().mean()

    train_compiled(model, compile_backend(root, inner="eager"), steps, loss_of)


def _lines(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("step*/rank*/*.jsonl"))}


@pytest.fixture
def made(monkeypatch) -> list[int]:
    """The record counts of each LineTemplates made (a spy on its constructor)."""
    sizes: list[int] = []
    real = record_json.LineTemplates.__init__

    def counting(self, records):
        sizes.append(len(records))
        real(self, records)

    monkeypatch.setattr(record_json.LineTemplates, "__init__", counting)
    return sizes


def test_pre_encoded_steps_are_the_bytes_record_objects_give(tmp_path: Path, monkeypatch, made) -> None:
    _run(tmp_path / "templates")
    assert made, "the repeated steps did not take the pre-encoded lines"

    def refuse(self, records):
        raise ValueError("test: record objects only")

    monkeypatch.setattr(record_json.LineTemplates, "__init__", refuse)
    _run(tmp_path / "objects")
    a, b = _lines(tmp_path / "templates"), _lines(tmp_path / "objects")
    assert sorted(a) == sorted(b) and len([k for k in a if k.endswith("records.jsonl")]) == 4
    for k in a:
        assert a[k] == b[k], k
    assert b'"max":"Infinity"' in a["step2/rank0/records.jsonl"] or b'"NaN"' in a["step2/rank0/records.jsonl"]


def _records(n: int) -> list:
    out = []
    for i in range(n):
        r = op_record(i, f"Aten.mm.{i}.forward", "aten.mm.default", "aten", "forward", "fc\"1", i, 0, 0, "Linear",
                      None, 3, {"compiled": True, "node": f"mm_{i}"})
        r.tensors = [tensor_entry("output", "0", "float32", (2, 3), (3, 1), "cpu", False)]
        out.append(r)
    return out


def test_line_templates_spell_what_encode_lines_spells() -> None:
    rows = [[1.5, -2.0, 0.25, 3.0, 0, 0], [float("nan"), float("nan"), float("nan"), float("nan"), 2, 0],
            [float("inf"), -1.0, float("inf"), float("inf"), 0, 1], None]
    tpl = record_json.LineTemplates(_records(4))
    objs = _records(4)
    for r, row in zip(objs, rows):
        r.step = 7
        r.tensors[0].stats = None if row is None else record_json.stats_dict(row, set())
    assert tpl.encode(7, rows) == record_json.encode_lines(objs)
    with pytest.raises(ValueError):
        tpl.encode(7, rows[:3])


def test_a_record_that_does_not_fit_is_refused() -> None:
    two = _records(1)
    two[0].tensors.append(tensor_entry("output", "1", "float32", (2,), (1,), "cpu", False))
    with pytest.raises(ValueError):
        record_json.LineTemplates(two)
    marked = _records(1)
    marked[0].module = "\x01torchparity-stats\x01"  # the stand-in in a value: two occurrences
    with pytest.raises(ValueError):
        record_json.LineTemplates(marked)


def test_only_plain_tensor_entries_awaiting_statistics_are_taken() -> None:
    for change in (lambda e: setattr(e, "md5", "abc"), lambda e: setattr(e, "producer", [0, 0]),
                   lambda e: setattr(e, "file", "t.safetensors"), lambda e: setattr(e, "kind", "scalar"),
                   lambda e: setattr(e, "stats", {"max": 1.0})):
        recs = _records(1)
        change(recs[0].tensors[0])
        with pytest.raises(ValueError):  # encode_lines would spell these otherwise
            record_json.LineTemplates(recs)


def test_a_refused_batch_of_lines_is_counted_in_the_footer(tmp_path: Path) -> None:
    import json

    from torchparity.capture.batch import Batch
    from torchparity.dump.writer import DumpWriter

    w = DumpWriter(tmp_path / "d", {"tool_version": "test"}, fsync=False, rank=0)
    tpl = record_json.LineTemplates(_records(5))
    w.submit(Batch(0, 0, [], [], torch.zeros(5, 6, dtype=torch.float64), lines=tpl))
    w.flush()
    w.error = "test: the disk refused a write"  # what _fail leaves: later batches are only counted
    w.submit(Batch(0, 0, [], [], torch.zeros(5, 6, dtype=torch.float64), lines=tpl))
    w.end_step(0)
    w.close()
    footer = json.loads((tmp_path / "d" / "step0" / "rank0" / "footer.json").read_text())
    assert footer["records"] == 5 and footer["dropped_records"] == 5 and footer["complete"] is False


def test_the_placeholder_of_a_batched_value_never_carries_autograd_history() -> None:
    from torchparity.capture.stat_batch import StatBatcher
    from torchparity.compile.stats_op import _PLACEHOLDERS, collecting, value_stats_op

    op = value_stats_op()
    x = torch.randn(4, 4, requires_grad=True)
    refs = [None]
    with collecting(StatBatcher(), refs, cpu_too=True):
        out = op(x * 2, 0)  # grad enabled, an input with history
    assert refs[0] is not None and out.shape == (6,)
    for p in _PLACEHOLDERS.values():
        assert p.grad_fn is None and not p.requires_grad


def test_steps_alternating_between_two_graph_sequences_encode_each_once(tmp_path: Path, made) -> None:
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = compile_backend(tmp_path / "d", inner="eager")
    run = torch.compile(model, backend=cap)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    for i in range(6):
        if i % 2 == 0:  # a training step: forward and backward graphs
            run(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        else:  # an evaluation step: the forward graph alone
            with torch.no_grad():
                run(x)
        cap.step()
    cap.close()
    assert len(made) == 2, made  # one encoding per sequence, reused on its later steps
    assert len(list((tmp_path / "d").glob("step*/rank0/records.jsonl"))) == 6
