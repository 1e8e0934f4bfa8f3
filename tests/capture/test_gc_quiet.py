"""The heap is frozen for the collector while a tool captures, and given back afterwards."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import torchparity
from torchparity.capture import gc_quiet


@pytest.fixture(autouse=True)
def _clean_heap():
    gc.unfreeze()
    yield
    gc.unfreeze()


def _step(model: torch.nn.Module) -> None:
    model(torch.randn(2, 4)).sum().backward()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_dump_freezes_the_heap_and_gives_it_back(tmp_path):
    model = torch.nn.Linear(4, 3)
    assert gc.get_freeze_count() == 0
    with torchparity.dump(tmp_path / "d", level="aten", model=model):
        assert gc.get_freeze_count() > 0
        _step(model)
    assert gc.get_freeze_count() == 0
    assert gc_quiet.holders() == 0


def test_a_module_level_dump_freezes_too(tmp_path):
    model = torch.nn.Linear(4, 3)
    with torchparity.dump(tmp_path / "d", level="module", model=model):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_nested_tools_unfreeze_when_the_last_one_stops(tmp_path):
    model = torch.nn.Linear(4, 3)
    tracker = torchparity.NanInfTracker(model).start()
    try:
        with torchparity.dump(tmp_path / "d", level="aten", model=model):
            _step(model)
        assert gc.get_freeze_count() > 0, "the tracker still runs"
    finally:
        tracker.stop()
    assert gc.get_freeze_count() == 0


def test_a_heap_the_process_froze_itself_stays_frozen(tmp_path):
    gc.freeze()
    before = gc.get_freeze_count()
    with torchparity.dump(tmp_path / "d", level="aten", model=torch.nn.Linear(4, 3)):
        pass
    assert gc.get_freeze_count() >= before > 0


def test_the_environment_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHPARITY_GC_FREEZE", "0")
    with torchparity.dump(tmp_path / "d", level="aten", model=torch.nn.Linear(4, 3)):
        assert gc.get_freeze_count() == 0


def test_a_cycle_that_died_during_the_capture_is_collected_after_it(tmp_path):
    c = _Cycle()
    ref = weakref.ref(c)
    with torchparity.dump(tmp_path / "d", level="aten", model=torch.nn.Linear(4, 3)):
        del c
        gc.collect()
        assert ref() is not None, "frozen: the collector skips it while the dump runs"
    gc.collect()
    assert ref() is None


def test_paused_turns_the_collector_off_and_back_on_but_never_on_when_it_was_off():
    assert gc.isenabled()
    with gc_quiet.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_quiet.paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the process had turned it off"
    finally:
        gc.enable()


def test_the_summaries_are_built_with_the_collector_paused(tmp_path, monkeypatch):
    from torchparity.dump import columnar

    seen = []
    orig = columnar.write_tables

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return orig(*a, **k)

    monkeypatch.setattr(columnar, "write_tables", spy)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchparity.dump(tmp_path / "d", level="aten", model=model, summaries="step"):
        _step(model)
        opt.step()
    assert seen and not any(seen)
    assert gc.isenabled()
