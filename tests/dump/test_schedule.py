"""When to capture: ``every=N``, ``steps`` combined with it, and the light tier between full steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.errors import DumpError, UsageError
from torchparity.toymodels import TinyConfig, make_batches, make_model, train

CFG = TinyConfig(dim=32, hidden=64, layers=1, seq=8, batch=2)


def _records(d: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (d / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()]


def _header(d: Path, step: int) -> dict:
    return json.loads((d / f"step{step}" / "rank0" / "header.json").read_text())


def _run(out: Path, n: int = 7, **opts) -> list[float]:
    model, batches = make_model(cfg=CFG), make_batches(n, cfg=CFG)
    with torchparity.dump(str(out), model=model, fsync=False, **opts):
        return train(model, batches)


def test_every_3_over_7_steps_full_on_0_3_6_light_otherwise(tmp_path: Path) -> None:
    baseline = train(make_model(cfg=CFG), make_batches(7, cfg=CFG))
    out = tmp_path / "d"
    losses = _run(out, level="aten", every=3, light="module")
    assert losses == baseline  # bitwise: the schedule never changes the numerics
    assert sorted(int(p.name[4:]) for p in out.glob("step*")) == list(range(7))
    for step in range(7):
        recs, hdr = _records(out, step), _header(out, step)
        levels = {r["level"] for r in recs}
        if step in (0, 3, 6):
            assert hdr["tier"] == "full" and hdr["level"] == "aten"
            assert levels == {"aten"}, (step, levels)
        else:
            assert hdr["tier"] == "light" and (hdr["level"], hdr["mode"]) == ("module", "statistics")
            assert levels == {"module"}, (step, levels)
            assert {r["name"].split(".")[0] for r in recs} <= {"Module", "Grad"}
            # module statistics, NaN/Inf counts included, on inputs and outputs
            stats = [t["stats"] for r in recs for t in r["tensors"] if t.get("stats")]
            assert stats and all("nan" in s and "inf" in s for s in stats)
            assert {t["io"] for r in recs for t in r["tensors"]} >= {"input", "output"}
    assert _header(out, 0)["schedule"] == {"steps": None, "every": 3, "light": "module"}


def test_a_light_step_records_what_a_module_level_dump_records(tmp_path: Path) -> None:
    """Same records, same statistics (bitwise) as a module-level dump of the same step."""
    light, module = tmp_path / "light", tmp_path / "module"
    _run(light, n=2, level="aten", every=2, light="module")
    _run(module, n=2, level="module")

    def content(d: Path) -> list:
        return sorted((r["name"], [(t["io"], t["arg"], t.get("stats")) for t in r["tensors"]])
                      for r in _records(d, 1))

    assert content(light) == content(module)


def test_without_light_only_full_steps_are_written(tmp_path: Path) -> None:
    out = tmp_path / "d"
    _run(out, n=5, level="api", every=2)
    assert sorted(p.name for p in out.glob("step*")) == ["step0", "step2", "step4"]
    assert _header(out, 2)["tier"] == "full"


def test_steps_and_every_combine(tmp_path: Path) -> None:
    """Full on the steps of ``steps`` that are multiples of ``every``; light on every other step."""
    out = tmp_path / "d"
    _run(out, n=7, level="aten", steps=[2, 3, 4, 5, 6], every=3, light="module")
    tiers = {s: _header(out, s)["tier"] for s in range(7)}
    assert tiers == {0: "light", 1: "light", 2: "light", 3: "full", 4: "light", 5: "light", 6: "full"}


def test_light_steps_save_no_tensors_in_tensor_mode(tmp_path: Path) -> None:
    out = tmp_path / "d"
    _run(out, n=3, level="module", mode="tensor", every=2, light="module")
    full = [t for r in _records(out, 0) for t in r["tensors"] if t.get("file")]
    light = [t for r in _records(out, 1) for t in r["tensors"] if t.get("file")]
    assert full and not light
    assert not list((out / "step1" / "rank0").glob("*.safetensors"))


def test_compare_two_scheduled_dumps_pairs_like_with_like(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, n=4, level="aten", every=3, light="module")
    _run(b, n=4, level="aten", every=3, light="module")
    res = torchparity.compare(str(a), str(b), workers=1)
    rows = res.rows
    assert sorted(set(rows["step"])) == [0, 1, 2, 3]
    assert set(rows.loc[rows["step"].isin([1, 2]), "level"]) == {"module"}
    assert set(rows.loc[rows["step"].isin([0, 3]), "level"]) == {"aten"}
    assert res.root_cause is None  # identical runs

    # another schedule on the bench side: a full step never faces a light one
    c = tmp_path / "c"
    _run(c, n=4, level="aten", every=2, light="module")
    res = torchparity.compare(str(a), str(c), workers=1)
    assert sorted(set(res.rows["step"])) == [0, 1]  # 2: light vs full, 3: full vs light
    warns = " ".join(res.summary["warnings"])
    assert "step2/rank0 was captured fully" in warns and "step3/rank0 was captured fully" in warns
    with pytest.raises(DumpError, match="recorded alike"):
        torchparity.compare(str(a), str(c), step=2, workers=1)


@pytest.mark.parametrize("opts,match", [
    ({"every": 0}, "every must be a whole number >= 1"),
    ({"every": "3"}, "every must be a whole number >= 1"),
    ({"every": True}, "every must be a whole number >= 1"),
    ({"every": 2, "light": "aten"}, "light must be one of module"),
    ({"light": "module"}, "give every=N or steps"),
    ({"steps": [1, -2]}, "steps must be a list of step numbers"),
    ({"steps": "0,1"}, "steps must be a list of step numbers"),
])
def test_bad_schedule_values_are_one_line_errors(tmp_path: Path, opts: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match) as exc:
        torchparity.dump(str(tmp_path / "d"), **opts)
    assert "\n" not in str(exc.value)


def test_yaml_config_takes_every_and_light(tmp_path: Path) -> None:
    cfg = tmp_path / "dump.yaml"
    cfg.write_text("level: aten\nevery: 4\nlight: module\n")
    d = torchparity.dump(str(tmp_path / "d"), config=str(cfg))
    assert (d.options.every, d.options.light) == (4, "module")


@pytest.mark.parametrize("args,match", [
    (["--every", "0"], "every must be a whole number >= 1"),
    (["--light", "module"], "give every=N or steps"),
    (["--every", "x"], "Invalid value for '--every'"),
])
def test_cli_run_rejects_bad_schedule_with_exit_2(tmp_path: Path, args: list[str], match: str) -> None:
    p = subprocess.run([sys.executable, "-m", "torchparity", "run", "-o", str(tmp_path / "d"), *args, "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert match in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "d").exists()  # refused before the script ran


def test_cli_run_passes_the_schedule_to_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from torchparity.toymodels import TinyConfig, make_batches, make_model, train\n"
        "cfg = TinyConfig(dim=16, hidden=32, layers=1, seq=4, batch=2)\n"
        "train(make_model(cfg=cfg), make_batches(3, cfg=cfg))\n")
    out = tmp_path / "d"
    p = subprocess.run([sys.executable, "-m", "torchparity", "run", "-o", str(out), "--every", "2", "--light",
                        "module", "--", sys.executable, str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert [_header(out, s)["tier"] for s in range(3)] == ["full", "light", "full"]


def test_msprobe_stop_pauses_module_records_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The msprobe façade's stop() pauses an L0 (module) dump as it pauses the other levels."""
    from torchparity.compat.msprobe import PrecisionDebugger

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"task": "statistics", "dump_path": "./d", "level": "L0",
                                                      "step": [], "rank": [], "statistics": {}}))
    debugger = PrecisionDebugger(config_path="./config.json")
    model, x = make_model(cfg=CFG), make_batches(1, cfg=CFG)[0][0]
    debugger.start(); model(x); debugger.stop()
    model(x)  # not dumped
    debugger.step()
    debugger.start(); model(x); debugger.stop(); debugger.close()
    assert len(_records(tmp_path / "d", 0)) == len(_records(tmp_path / "d", 1)) > 0


# ---- between full steps the op stream leaves the dispatch-mode stack (capture/op_stream.py pause) ----


def _intercepting_per_step(out: Path, n: int, **opts) -> list[bool]:
    """Whether the op stream intercepted ops during each step's forward (read in a forward hook)."""
    from torchparity.capture.op_stream import op_stream

    model, batches = make_model(cfg=CFG), make_batches(n, cfg=CFG)
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda m, a: seen.append(op_stream().intercepting))
    with torchparity.dump(str(out), model=model, fsync=False, **opts):
        train(model, batches)
    return seen


def test_between_full_steps_no_op_is_intercepted(tmp_path: Path) -> None:
    assert _intercepting_per_step(tmp_path / "a", 7, level="aten", every=3, light="module") == \
        [s in (0, 3, 6) for s in range(7)]
    assert _intercepting_per_step(tmp_path / "b", 4, level="aten", steps=[2]) == [False, False, True, False]
    # every step full: never paused
    assert _intercepting_per_step(tmp_path / "c", 3, level="aten") == [True, True, True]


def test_full_steps_record_the_same_after_a_gap(tmp_path: Path, monkeypatch) -> None:
    """The records of the full steps are the same whether the gaps between them intercept ops or
    not (nothing measured before a gap is reused after it)."""
    from torchparity.capture.op_stream import OpStream

    _run(tmp_path / "paused", n=5, level="aten", every=2, light="module")
    monkeypatch.setattr(OpStream, "pause", lambda self, consumer: None)  # the gaps intercept, as before
    _run(tmp_path / "seen", n=5, level="aten", every=2, light="module")
    for step in range(5):
        assert _records(tmp_path / "paused", step) == _records(tmp_path / "seen", step), step


@pytest.mark.parametrize("level", ["aten", "api"])
def test_a_write_through_data_in_a_gap_is_measured_at_the_next_full_step(tmp_path: Path, level: str) -> None:
    """A parameter changed through ``.data`` (no version bump of the parameter) between full
    steps, where the op stream (aten) or the function mode (api) was off its stack: the next full
    step records its new values, not the statistics remembered before."""
    model, batches = make_model(cfg=CFG), make_batches(3, cfg=CFG)
    w = next(model.parameters())
    # the optimizer leaves w alone: only the write through .data changes it (no version bump)
    opt = torch.optim.SGD([p for p in model.parameters() if p is not w], lr=0.0)
    with torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level=level, every=2):
        for i, (x, y) in enumerate(batches):
            if i == 1:  # the gap: the parameter changes where no op is intercepted
                w.data.mul_(3.0)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    norms = {}
    for step in (0, 2):
        for r in _records(tmp_path / "d", step):
            for t in r["tensors"]:
                if t["io"] == "input" and tuple(t.get("shape") or ()) == tuple(w.shape) and t.get("stats"):
                    norms.setdefault(step, t["stats"]["norm"])
    assert norms[2] == pytest.approx(3 * norms[0], rel=1e-5)


def test_a_nan_tracker_beside_a_scheduled_dump_keeps_every_op(tmp_path: Path) -> None:
    from torchparity.capture.op_stream import op_stream

    model, batches = make_model(cfg=CFG), make_batches(3, cfg=CFG)
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda m, a: seen.append(op_stream().intercepting))
    with torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level="aten", every=3):
        with torchparity.NanInfTracker(model):
            train(model, batches)
    assert seen == [True, True, True]


def test_a_user_dispatch_mode_around_each_iteration_leaves_full_steps_and_the_stack_intact(tmp_path: Path) -> None:
    """A mode the user enters around every iteration (a flop counter, a profiler) while the dump
    pauses between full steps: the full steps are recorded, the mode stack unwinds in order, and
    the stream works for a later tool."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    from torchparity.capture.op_stream import op_stream

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level="aten", steps=[1, 3]):
        for x, y in batches:
            with Counting():
                F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
                opt.step()
                opt.zero_grad()
    assert sorted(p.name for p in (tmp_path / "d").glob("step*")) == ["step1", "step3"]
    assert {r["level"] for r in _records(tmp_path / "d", 3)} == {"aten"}
    assert _get_current_dispatch_mode_stack() == []
    with torchparity.NanInfTracker(model):
        before = op_stream().intercepted
        model(batches[0][0])
        assert op_stream().intercepted > before


def test_a_buffer_written_in_a_gap_is_measured_in_the_light_steps(tmp_path: Path) -> None:
    """A storage made by ``empty`` in a full step and filled in a gap (unseen): the light steps'
    module records measure it (no stale 'uninitialised' mark)."""

    class Cache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.buf = None

        def forward(self, x):
            if self.buf is None:
                self.buf = torch.empty(8)
            return self.buf

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.cache = torch.nn.Linear(4, 4), Cache()

        def forward(self, x):
            return self.lin(x).sum() + self.cache(x).sum().detach() * 0

    m = M()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with torchparity.dump(str(tmp_path / "d"), model=m, fsync=False, level="aten", every=3, light="module"):
        for i in range(3):
            if i == 1:
                m.cache.buf.data.fill_(1.0)
            m(torch.ones(2, 4)).backward()
            opt.step()
            opt.zero_grad()
    for step in (1, 2):
        out = [t for r in _records(tmp_path / "d", step) if r["name"].startswith("Module.cache")
               for t in r["tensors"] if t["io"] == "output"]
        assert out and out[0].get("stats") and out[0]["stats"]["max"] == 1.0, (step, out)


# ---- between full steps the api level's function mode leaves its stack (ApiCaptureMode) ----


def _api_mode_on_stack_per_step(out: Path, n: int, **opts) -> list[bool]:
    """Whether the dump's ApiCaptureMode was on the torch-function-mode stack during each step's
    forward (read in a forward pre-hook: hooks run outside any mode's handler)."""
    from torch.overrides import _get_current_function_mode_stack

    from torchparity.capture.api_mode import ApiCaptureMode

    model, batches = make_model(cfg=CFG), make_batches(n, cfg=CFG)
    seen: list[bool] = []
    model.register_forward_pre_hook(
        lambda m, a: seen.append(any(isinstance(x, ApiCaptureMode) for x in _get_current_function_mode_stack())))
    with torchparity.dump(str(out), model=model, fsync=False, **opts):
        train(model, batches)
    assert not _get_current_function_mode_stack()
    return seen


@pytest.mark.parametrize("level", ["api", "mix"])
def test_between_full_steps_the_api_mode_is_off_its_stack(tmp_path: Path, level: str) -> None:
    assert _api_mode_on_stack_per_step(tmp_path / "a", 7, level=level, every=3, light="module") == \
        [s in (0, 3, 6) for s in range(7)]
    assert _api_mode_on_stack_per_step(tmp_path / "b", 4, level=level, steps=[2]) == [False, False, True, False]
    assert _api_mode_on_stack_per_step(tmp_path / "c", 3, level=level) == [True, True, True]


@pytest.mark.parametrize("level", ["api", "mix"])
def test_api_full_steps_record_the_same_after_a_gap(tmp_path: Path, monkeypatch, level: str) -> None:
    """A scheduled api/mix dump's full steps record the same whether its function mode stayed on
    the stack in the gaps (passing calls through, as before) or left it."""
    from torchparity.capture.api_mode import ApiCaptureMode
    from torchparity.capture.op_stream import OpStream

    baseline = train(make_model(cfg=CFG), make_batches(5, cfg=CFG))
    assert _run(tmp_path / "paused", n=5, level=level, every=2, light="module") == baseline
    monkeypatch.setattr(ApiCaptureMode, "_follow_tier", lambda self: None)
    monkeypatch.setattr(OpStream, "pause", lambda self, consumer: None)
    _run(tmp_path / "seen", n=5, level=level, every=2, light="module")
    for step in range(5):
        assert _records(tmp_path / "paused", step) == _records(tmp_path / "seen", step), step


def test_a_user_function_mode_around_each_iteration_leaves_api_full_steps_and_the_stack_intact(tmp_path: Path) -> None:
    """A torch-function mode the user enters around every iteration while a scheduled api dump
    leaves and rejoins the stack: the full steps are recorded, the user's ``with`` exits pop the
    user's mode, and the stack is empty at the end."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    class Passing(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Passing.calls += 1
            return func(*args, **(kwargs or {}))

    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level="api", steps=[1, 3]):
        for x, y in batches:
            with Passing() as p:
                F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
                opt.step()
                assert _get_current_function_mode_stack()[-1] is p  # the user's mode stays on top
                opt.zero_grad()
    assert not _get_current_function_mode_stack()
    assert sorted(p.name for p in (tmp_path / "d").glob("step*")) == ["step1", "step3"]
    for step in (1, 3):
        recs = _records(tmp_path / "d", step)
        assert {r["level"] for r in recs} == {"api"} and any(r["phase"] == "forward" for r in recs)
    assert Passing.calls > 0


@pytest.mark.parametrize("level", ["api", "aten"])
def test_module_exits_tag_the_autograd_graph_on_full_steps_only(tmp_path: Path, monkeypatch, level: str) -> None:
    """The backward tags are read by the records of full steps: between them no walk is made."""
    from torchparity.capture import module_capture

    walks: list[int] = []
    real = module_capture.tag_graph
    step = [0]

    def counting(*a, **k):
        walks.append(step[0])
        return real(*a, **k)

    monkeypatch.setattr(module_capture, "tag_graph", counting)
    model, batches = make_model(cfg=CFG), make_batches(4, cfg=CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchparity.dump(str(tmp_path / "d"), model=model, fsync=False, level=level, steps=[1, 3], light="module"):
        for i, (x, y) in enumerate(batches):
            step[0] = i
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad()
    assert sorted(set(walks)) == [1, 3]
    # the full steps' backward records still name their modules
    assert any(r["phase"] == "backward" and r["module"] for r in _records(tmp_path / "d", 3))
