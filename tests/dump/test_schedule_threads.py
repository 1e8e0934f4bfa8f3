"""The queue of mode-stack changes that waits for the end of a backward pass
(capture/outside_backward.py): other threads, recompute, and what it cannot do (found by the
session-14 review; the known limitations are strict xfails, so a fix shows up)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

import torchparity
from torchparity.capture.api_mode import ApiCaptureMode
from torchparity.toymodels import TinyConfig, make_batches, make_model

from tests.dump.in_backward import optimizer_in_backward as _optimizer_in_backward
from tests.dump.in_backward import records as _records

CFG = TinyConfig(dim=32, hidden=64, layers=1, seq=8, batch=2)


def _cleanup_modes() -> None:
    """Leave the process clean for later tests, whatever a bug left behind (a stream mode the
    op stream believes on a stack it is not on poisons every later aten dump in the process)."""
    from torchparity.capture.op_stream import op_stream

    while _get_current_function_mode_stack():
        torch.overrides._pop_mode()
    while _get_current_dispatch_mode_stack():
        _pop_mode()
    st = op_stream()
    if not st._consumers:
        st._mode, st._off, st._raw = None, False, False


@pytest.mark.parametrize("level", ["api", "aten"])
def test_queued_change_drained_on_another_thread(tmp_path: Path, level: str) -> None:
    """A step begins inside backward (optimizer in backward): the change is queued. The first
    module entry after backward happens on another thread (a background eval/teacher thread):
    in_backward() is False there, so _drain runs the change on *that* thread, pushing the mode
    (api: the function mode; aten: the op stream's dispatch mode) onto that thread's stack.
    The main thread's full step 2 then runs without it."""
    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    _optimizer_in_backward(model)
    other = torch.nn.Linear(4, 4)
    d = tmp_path / "d"
    dumper = torchparity.dump(str(d), model=model, fsync=False, level=level, steps=[2]).start()
    try:
        for x, y in batches:
            # a background thread runs some module between the backward and the next forward
            t = threading.Thread(target=lambda: other(torch.randn(2, 4)))
            t.start()
            t.join()
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    finally:
        dumper.stop()
        _cleanup_modes()
    fwd = [r["name"] for r in _records(d, 2) if r["level"] == level and r["phase"] == "forward"]
    # without the thread: ~50 records of the model's forward; observed: only the thread's linear
    assert len(fwd) > 10, fwd


@pytest.mark.xfail(strict=True, reason="known limitation: a dump stopped inside backward (from a gradient "
                   "hook) leaves its mode on the caller's stack; docs/dump.md says to stop it outside")
@pytest.mark.parametrize("level", ["api", "aten"])
def test_stop_inside_backward_leaves_no_mode_on_the_stack(tmp_path: Path, level: str) -> None:
    """The dump is stopped from a gradient hook (e.g. the optimizer-in-backward hook ending the
    last wanted step). The api mode's exit pops it off the engine's copy of the stack, which the
    engine throws away: the stopped mode stays on the caller's stack after backward returns.
    (Stack changes are queued for outside backward at step boundaries, not at exit.)"""
    model, batches = make_model(cfg=CFG), make_batches(2, cfg=CFG)
    d = tmp_path / "d"
    dumper = torchparity.dump(str(d), model=model, fsync=False, level=level).start()
    done = []

    def hook(p: torch.Tensor) -> None:
        if not done:
            done.append(True)
            dumper.stop()

    next(model.parameters()).register_post_accumulate_grad_hook(hook)
    x, y = batches[0]
    try:
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        left = [type(m).__name__ for m in _get_current_function_mode_stack()]
        left += [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
    finally:
        _cleanup_modes()
        while _get_current_dispatch_mode_stack():
            _pop_mode()
    assert done
    assert left == [], left


class _Ckpt(torch.nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.b = torch.nn.Linear(8, 8)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.a, x, use_reentrant=self.reentrant)
        return self.b(h)


@pytest.mark.parametrize("level", ["api", "aten"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_step_begins_in_backward_before_a_recompute(tmp_path: Path, level: str, reentrant: bool) -> None:
    """The step boundary (optimizer in backward, b's params first) happens before the checkpointed
    segment's recompute: the recompute's module entries are inside backward and must not drain;
    each full step then records its forward and the stacks end clean."""
    torch.manual_seed(0)
    model = _Ckpt(reentrant)
    _optimizer_in_backward(model)
    d = tmp_path / "d"
    dumper = torchparity.dump(str(d), model=model, fsync=False, level=level, steps=[2]).start()
    try:
        for _ in range(4):
            x = torch.randn(4, 8, requires_grad=reentrant)
            model(x).square().mean().backward()
    finally:
        dumper.stop()
        left = [type(m).__name__ for m in _get_current_function_mode_stack()]
        left += [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
        _cleanup_modes()
        while _get_current_dispatch_mode_stack():
            _pop_mode()
    fwd = [r["name"] for r in _records(d, 2) if r["level"] == level and r["phase"] == "forward"]
    assert len(fwd) >= 3, fwd
    for s in (0, 1, 3):
        assert not [r for r in _records(d, s) if r["level"] == level], s
    assert left == [], left


@pytest.mark.xfail(strict=True, reason="known limitation: a full step that begins inside backward is "
                   "followed from its first module entry (docs/dump.md)")
@pytest.mark.parametrize("level", ["api", "aten"])
def test_ops_before_the_first_module_entry_of_a_full_step_begun_in_backward(tmp_path: Path, level: str) -> None:
    """Limitation: the full step begun inside backward is only followed at the first module
    entry, so the step's ops before it (input preprocessing outside any module) are not recorded,
    although an ordinary loop records them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    _optimizer_in_backward(model)
    d = tmp_path / "d"
    with torchparity.dump(str(d), model=model, fsync=False, level=level, steps=[2]):
        for _ in range(4):
            x = torch.randn(4, 8)
            x = torch.tanh(x)  # preprocessing outside any module
            model(x).square().mean().backward()
    names = [r["name"] for r in _records(d, 2) if r["level"] == level and r["phase"] == "forward"]
    assert any("tanh" in n for n in names), names


def test_a_change_that_raises_does_not_drop_the_changes_after_it() -> None:
    """Two changes wait for the end of a backward pass; the first raises when drained: the second
    still runs, and the first's error comes out once both ran (session-14 review)."""
    from torchparity.capture.module_tracker import ModuleTracker
    from torchparity.capture.outside_backward import OutsideBackward

    tracker = ModuleTracker()
    queue = OutsideBackward(tracker)
    ran: list[str] = []

    def bad() -> None:
        ran.append("bad")
        raise RuntimeError("boom")

    def good() -> None:
        ran.append("good")

    # queued as they would be inside backward (another thread stands in for "not here")
    t = threading.Thread(target=lambda: (queue.run(bad), queue.run(good)))
    t.start()
    t.join()
    assert ran == []
    with pytest.raises(RuntimeError, match="boom"):
        queue._drain(None, (), {})
    assert ran == ["bad", "good"]
    queue._drain(None, (), {})  # nothing left to run
    assert ran == ["bad", "good"]
