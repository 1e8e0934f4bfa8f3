"""A scheduled dump whose steps begin inside backward, and torch's default-device mode set between
full steps: the capture modes leave and rejoin their stacks correctly (found by the session-14
review; each failed before its mend)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack

import torchparity
from torchparity.capture.api_mode import ApiCaptureMode
from torchparity.toymodels import TinyConfig, make_batches, make_model

from tests.dump.in_backward import optimizer_in_backward as _optimizer_in_backward
from tests.dump.in_backward import records as _records

CFG = TinyConfig(dim=32, hidden=64, layers=1, seq=8, batch=2)


def test_api_mode_going_back_at_a_step_that_begins_inside_backward(tmp_path: Path) -> None:
    """The step boundary runs inside backward (autograd hook): the function-mode stack
    seen there is the engine's, restored when backward returns, so the mode's push "back" is
    lost while ``_off`` says it is on. Step 2 (full) records no api op, and the dump's exit pops
    an empty stack (RuntimeError: trying to pop from empty mode stack)."""
    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    _optimizer_in_backward(model)
    d = tmp_path / "d"
    on_stack: list[bool] = []
    # read in the model's forward pre-hook: a step that begins inside backward is followed at the
    # first module entry outside it (the tracker's global hook runs before the model's own)
    model.register_forward_pre_hook(
        lambda m, a: on_stack.append(any(isinstance(x, ApiCaptureMode) for x in _get_current_function_mode_stack())))
    dumper = torchparity.dump(str(d), model=model, fsync=False, level="api", steps=[2]).start()
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    stop_error = None
    try:
        dumper.stop()
    except RuntimeError as exc:  # observed: "trying to pop from empty mode stack"
        stop_error = exc
    assert not _get_current_function_mode_stack()
    assert on_stack == [False, False, True, False], on_stack  # observed before the mend: [False] * 4
    assert any(r["level"] == "api" and r["phase"] == "forward" for r in _records(d, 2))  # observed: none
    assert stop_error is None, stop_error


def test_aten_stream_going_back_at_a_step_that_begins_inside_backward(tmp_path: Path) -> None:
    """The same at the aten level (the op stream's pause): step 2 of steps=[2] was not recorded
    at all when the step began inside backward."""
    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    _optimizer_in_backward(model)
    d = tmp_path / "d"
    with torchparity.dump(str(d), model=model, fsync=False, level="aten", steps=[2]):
        for x, y in batches:
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert any(r["level"] == "aten" and r["phase"] == "forward" for r in _records(d, 2))


def test_default_device_set_in_a_gap_stays_at_the_bottom_of_the_stack(tmp_path: Path) -> None:
    """``torch.set_default_device`` in a gap puts torch's DeviceContext on the (then
    empty) stack; at the next full step the mode goes back *under* it, breaking the invariant
    that DeviceContext is at the bottom. The dump's exit then pops the DeviceContext and leaves
    the stopped dump's ApiCaptureMode on the stack for good; torch.set_default_device(None)
    raises AssertionError ("Expected a DeviceContext at the bottom of the mode stack")."""
    model, batches = make_model(cfg=CFG), make_batches(3, cfg=CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stacks: list[list[str]] = []
    model.register_forward_pre_hook(lambda m, a: stacks.append(
        [type(x).__name__ for x in _get_current_function_mode_stack()]))
    dumper = torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level="api", steps=[1]).start()
    try:
        torch.set_default_device("cpu")  # step 0 is a gap: the mode is off its stack
        for x, y in batches:
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad()
    finally:
        dumper.stop()
    leaked = [type(m).__name__ for m in _get_current_function_mode_stack()]  # observed: ['ApiCaptureMode']
    reset_error = None
    try:
        torch.set_default_device(None)
    except AssertionError as exc:  # observed: "Expected a DeviceContext at the bottom of the mode stack"
        reset_error = exc
    finally:
        # leave the process clean for other tests, whatever happened
        while _get_current_function_mode_stack():
            torch.overrides._pop_mode()
        glob = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
        if glob is not None and hasattr(glob, "device_context"):  # newer torch: a thread-local holder
            glob.device_context = None
        elif glob is not None:  # torch 2.1: the DeviceContext itself
            torch._GLOBAL_DEVICE_CONTEXT = None
        if hasattr(torch.utils._device, "CURRENT_DEVICE"):
            torch.utils._device.CURRENT_DEVICE = None
    # the full step ran under the api mode, above torch's default-device mode
    assert stacks == [["DeviceContext"], ["DeviceContext", "ApiCaptureMode"], ["DeviceContext"]], stacks
    assert leaked == ["DeviceContext"], leaked
    assert reset_error is None, reset_error
