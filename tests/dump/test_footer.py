"""footer.json as the reader and `torchparity info` present it: interrupted steps, tensors dropped
by an error or by the max_bytes budget, fields of the wrong type (issue 13, readers part 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.dump.reader import damage, open_dump, read_unit


def _info(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from torchparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["info", str(path)])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))


def _warnings(root: Path) -> list[str]:
    w: list[str] = []
    read_unit(open_dump(root).unit(0, 0), w)
    return w


def test_interrupted_step_is_shown_as_interrupted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: info said "INCOMPLETE (footer.json does not say complete)" and the reader called the
    footer damaged, though it said which exception stopped the step."""
    model, out = _model(), tmp_path / "d"
    with pytest.raises(RuntimeError, match="peer died"):
        with torchparity.dump(str(out), level="aten"):
            model(torch.randn(3, 4))
            raise RuntimeError("peer died")
    footer = json.loads((out / "step0" / "rank0" / "footer.json").read_text())
    assert footer["complete"] is False and "RuntimeError: peer died" in footer["interrupted"]
    text = _info(out, capsys)
    assert "INCOMPLETE (the step was interrupted: RuntimeError: peer died)" in text, text
    lost = damage(_warnings(out))
    assert len(lost) == 1 and "the step was interrupted (RuntimeError: peer died)" in lost[0], lost
    assert "damaged" not in lost[0]


def _drop_tensors_by_error(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    def full(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    model = _model()
    with torchparity.dump(str(out), level="aten", mode="tensor"):
        model(torch.randn(3, 4)).sum().backward()
    monkeypatch.undo()


def test_tensors_dropped_by_an_error_are_not_called_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Before: tensors the disk refused were reported as "the tensor budget was exhausted" (and
    the writer's error as "the rest of the run is not in the dump", though records went on)."""
    out = tmp_path / "d"
    _drop_tensors_by_error(out, monkeypatch)
    footer = json.loads((out / "step0" / "rank0" / "footer.json").read_text())
    assert footer["dropped_tensors"] > 0 and footer["dropped_records"] == 0 and footer["budget_exhausted"] is False
    w = _warnings(out)
    assert not damage(w), w  # records and statistics are all there
    told = [x for x in w if "not saved" in x]
    assert len(told) == 1 and "budget" not in told[0] and "No space left on device" in told[0], w
    assert f"{footer['dropped_tensors']} tensor(s) were not saved" in told[0]
    text = _info(out, capsys)
    assert f"INCOMPLETE ({footer['dropped_tensors']} tensor(s) not saved)" in text and "budget" not in text, text


def test_dropped_tensors_compare_statistics_never_a_tensor_pass(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A dump whose tensors were dropped compares its statistics; the rows without a tensor get
    no tensor metric (nothing is judged on a tensor that is not there), and the result says so."""
    dropped, full = tmp_path / "dropped", tmp_path / "full"
    _drop_tensors_by_error(dropped, monkeypatch)
    model = _model()
    with torchparity.dump(str(full), level="aten", mode="tensor"):
        model(torch.randn(3, 4)).sum().backward()
    res = torchparity.compare(dropped, full, tmp_path / "cmp")
    assert any("tensor(s) were not saved" in w for w in res.summary["warnings"]), res.summary["warnings"]
    tensors = res.rows[res.rows["kind"] == "tensor"] if "kind" in res.rows else res.rows
    assert len(tensors) and tensors["cosine"].isna().all()  # compared on statistics only


def test_budget_is_named_only_for_the_budget(tmp_path: Path) -> None:
    out = tmp_path / "d"
    model = _model()
    with torchparity.dump(str(out), level="aten", mode="tensor", max_bytes=64):
        model(torch.randn(3, 4)).sum().backward()
    w = _warnings(out)
    told = [x for x in w if "not saved" in x]
    assert not damage(w) and len(told) == 1 and "the tensor budget (max_bytes) was exhausted" in told[0], w


@pytest.mark.parametrize("footer, why", [
    ({"complete": True, "records": 1, "dropped_tensors": "x"}, "'dropped_tensors' is a string"),
    ({"complete": True, "records": 1, "dropped_records": -1}, "'dropped_records' is an integer (-1), not a count"),
    ({"complete": "yes", "records": 1}, "'complete' is a string"),
    ({"complete": False, "records": 1, "interrupted": 5}, "'interrupted' is an integer"),
    ({"complete": True, "records": 1, "budget_exhausted": 1}, "'budget_exhausted' is an integer"),
])
def test_footer_fields_of_the_wrong_type_are_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    footer: dict, why: str) -> None:
    model, out = _model(), tmp_path / "d"
    with torchparity.dump(str(out), level="module", model=model):
        model(torch.randn(3, 4))
    n = sum(1 for _ in (out / "step0" / "rank0" / "records.jsonl").open())
    (out / "step0" / "rank0" / "footer.json").write_text(json.dumps(dict(footer, records=n)))
    lost = damage(_warnings(out))
    assert len(lost) == 1 and why in lost[0] and "footer.json is damaged" in lost[0], lost
    assert "INCOMPLETE (footer.json is damaged)" in _info(out, capsys)


def test_records_not_written_are_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, out = _model(), tmp_path / "d"
    with torchparity.dump(str(out), level="module", model=model):
        model(torch.randn(3, 4))
    path = out / "step0" / "rank0" / "footer.json"
    footer = json.loads(path.read_text())
    path.write_text(json.dumps(dict(footer, complete=False, dropped_records=7)))
    lost = damage(_warnings(out))
    assert len(lost) == 1 and "7 record(s) were not written" in lost[0], lost
    assert "INCOMPLETE (7 record(s) were not written)" in _info(out, capsys)
