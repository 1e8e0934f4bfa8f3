"""The dump engine: bitwise transparency, naming, crash safety, distributed runs, filters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.errors import UsageError
from torchparity.toymodels import make_batches, make_model, train


def read_records(d: Path, step: int = 0, rank: int = 0) -> list[dict]:
    lines = (d / f"step{step}" / f"rank{rank}" / "records.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return sorted(recs, key=lambda r: r["id"])


def run_dumped(tmp_path: Path, n_steps: int = 2, **opts) -> tuple[list[float], Path]:
    out = tmp_path / f"dump_{len(list(tmp_path.iterdir()))}"
    model, batches = make_model(), make_batches(n_steps)
    with torchparity.dump(str(out), **opts):
        losses = train(model, batches)
    return losses, out


@pytest.mark.parametrize("level,mode", [("aten", "statistics"), ("api", "md5"), ("module", "tensor"), ("mix", "statistics")])
def test_results_bitwise_identical_with_tool_on(tmp_path: Path, level: str, mode: str) -> None:
    baseline = train(make_model(), make_batches(3))
    losses, out = run_dumped(tmp_path, n_steps=3, level=level, mode=mode)
    assert losses == baseline  # exact float equality, every step
    assert len(read_records(out, 0)) > 10


def test_parameters_bitwise_identical_after_training(tmp_path: Path) -> None:
    m1, m2 = make_model(), make_model()
    train(m1, make_batches(2))
    with torchparity.dump(str(tmp_path / "d"), level="mix"):
        train(m2, make_batches(2))
    for (n, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert torch.equal(p1, p2), n


def test_op_names_identical_across_two_runs(tmp_path: Path) -> None:
    _, a = run_dumped(tmp_path, level="aten")
    _, b = run_dumped(tmp_path, level="aten")
    for step in (0, 1):
        names_a = [r["name"] for r in read_records(a, step)]
        names_b = [r["name"] for r in read_records(b, step)]
        assert names_a == names_b and len(names_a) > 100


def test_records_have_phases_modules_and_backward_attribution(tmp_path: Path) -> None:
    _, out = run_dumped(tmp_path, level="aten")
    recs = read_records(out)
    phases = {r["phase"] for r in recs}
    assert {"forward", "backward", "optimizer"} <= phases
    fwd_mm = [r for r in recs if r["phase"] == "forward" and r["module"] == "layers.1.mlp.down_proj"]
    assert fwd_mm and fwd_mm[0]["module_class"] == "Linear"
    bwd = [r for r in recs if r["phase"] == "backward" and r["module"] == "layers.1.mlp.down_proj"]
    assert any(r["op"].startswith("aten.mm") for r in bwd), "backward matmuls must be attributed to the Linear"
    assert [r["id"] for r in recs] == list(range(len(recs)))
    # data flow: most forward inputs are linked to the record that produced them
    linked = [t for r in recs for t in r["tensors"] if t["io"] == "input" and t.get("producer")]
    assert len(linked) > 50
    for t in linked[:50]:
        assert t["producer"][0] < len(recs)


def test_api_level_names_and_true_backward(tmp_path: Path) -> None:
    _, out = run_dumped(tmp_path, level="api")
    recs = read_records(out)
    names = [r["name"] for r in recs]
    assert "Functional.linear.0.forward" in names
    assert "Functional.linear.0.backward" in names
    bwd = next(r for r in recs if r["name"] == "Functional.linear.0.backward")
    fwd = next(r for r in recs if r["name"] == "Functional.linear.0.forward")
    assert bwd["fwd"] == fwd["id"]
    # true VJP: grad w.r.t. the input x [4,16,64] and the weight [64,64], not a single view node
    out_shapes = sorted(tuple(t["shape"]) for t in bwd["tensors"] if t["io"] == "output")
    assert out_shapes == [(4, 16, 64), (64, 64)]


def test_module_level_records_forward_backward_and_param_grads(tmp_path: Path) -> None:
    _, out = run_dumped(tmp_path, level="module")
    names = {r["name"] for r in read_records(out)}
    assert "Module.layers.0.mlp.MLP.forward.0" in names
    assert "Module.layers.0.mlp.MLP.backward.0" in names
    assert "Grad.layers.0.mlp.up_proj.weight.0.backward" in names
    modules = [json.loads(x) for x in (out / "step0" / "rank0" / "modules.jsonl").read_text().splitlines()]
    assert {"path": "layers.0.mlp.up_proj", "class": "Linear", "parent": "layers.0.mlp"} in modules


def test_inplace_inputs_recorded_before_mutation(tmp_path: Path) -> None:
    x = torch.ones(8)
    with torchparity.dump(str(tmp_path / "d"), level="aten") as d:
        x.add_(5.0)
        d.step()
    rec = next(r for r in read_records(tmp_path / "d") if r["op"].startswith("aten.add_"))
    inp = next(t for t in rec["tensors"] if t["io"] == "input" and t["arg"] == "0")
    outp = next(t for t in rec["tensors"] if t["io"] == "output")
    assert inp["stats"]["max"] == 1.0 and outp["stats"]["max"] == 6.0
    assert rec["flags"]["inplace"] is True


def test_statistics_values_and_nonfinite_as_strict_json(tmp_path: Path) -> None:
    with torchparity.dump(str(tmp_path / "d"), level="aten") as d:
        a = torch.tensor([1.0, -3.0, float("nan"), float("inf")])
        (a * 2)
        d.step()
    text = (tmp_path / "d" / "step0" / "rank0" / "records.jsonl").read_text()
    json.loads(text.splitlines()[0], parse_constant=lambda c: pytest.fail(f"non-strict JSON token {c}"))
    rec = next(r for r in read_records(tmp_path / "d") if r["op"] == "aten.mul.Tensor")
    st = next(t for t in rec["tensors"] if t["io"] == "output")["stats"]
    assert st["nan"] == 1 and st["inf"] == 1 and st["max"] == "NaN"


def test_tensor_mode_saves_loadable_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    x = torch.randn(3, 4)
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="tensor") as d:
        y = x.exp()
        d.step()
    rec = next(r for r in read_records(tmp_path / "d") if r["op"] == "aten.exp.default")
    out = next(t for t in rec["tensors"] if t["io"] == "output")
    saved = load_file(str(tmp_path / "d" / "step0" / "rank0" / out["file"]))[out["key"]]
    assert torch.equal(saved, y)


def test_max_bytes_budget_stops_tensors_not_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="tensor", max_bytes=4096) as d:
        for _ in range(20):
            torch.randn(64, 64).exp()
        d.step()
    footer = json.loads((tmp_path / "d" / "step0" / "rank0" / "footer.json").read_text())
    assert footer["budget_exhausted"] is True and footer["tensor_bytes"] <= 4096
    recs = read_records(tmp_path / "d")
    assert sum(r["op"] == "aten.exp.default" for r in recs) == 20  # records continue
    assert "max_bytes" in caplog.text


def test_filters_steps_ops_scope_phases_io(tmp_path: Path) -> None:
    _, out = run_dumped(tmp_path, n_steps=3, level="aten", steps=[1], ops=["aten.mm*"], scope=["layers.1"],
                        phases=["forward", "backward"], io=["output"])
    assert not (out / "step0").exists() and not (out / "step2").exists()
    recs = read_records(out, 1)
    assert recs and all(r["op"].startswith("aten.mm") for r in recs)
    assert all(r["module"].startswith("layers.1") for r in recs)
    assert {r["phase"] for r in recs} == {"forward", "backward"}
    for r in recs:  # io filter: inputs are described but get no statistics
        assert all("stats" not in t for t in r["tensors"] if t["io"] == "input")


def test_op_range_and_skip(tmp_path: Path) -> None:
    _, full = run_dumped(tmp_path, n_steps=1, level="api")
    names = [r["name"] for r in read_records(full)]
    first, last = names[5], names[15]
    _, ranged = run_dumped(tmp_path, n_steps=1, level="api", op_range=[first, last])
    assert [r["name"] for r in read_records(ranged)] == names[5:16]
    _, skipped = run_dumped(tmp_path, n_steps=1, level="api", skip=3)
    assert [r["name"] for r in read_records(skipped)] == names[::3]


def test_options_errors_are_clear() -> None:
    with pytest.raises(UsageError, match="level must be one of"):
        torchparity.dump("x", level="L9")
    with pytest.raises(UsageError, match="unknown dump option"):
        torchparity.dump("x", colour="blue")


def test_msprobe_config_json_is_mapped(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "task": "statistics", "dump_path": str(tmp_path / "ms"), "rank": [], "step": ["0-1"], "level": "L1",
        "statistics": {"scope": [], "list": ["linear"], "data_mode": ["forward"], "summary_mode": "md5"}}))
    d = torchparity.dump(config=str(cfg))
    o = d.options
    assert (o.level, o.mode, o.steps, o.phases, o.ops) == ("api", "md5", [0, 1], ["forward", "recompute"], ["*linear*"])
    assert o.path == str(tmp_path / "ms")
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": "x", "bogus": 1}))
    with pytest.raises(UsageError, match="unknown msprobe key.*bogus"):
        torchparity.dump(config=str(cfg))


def test_yaml_config(tmp_path: Path) -> None:
    cfg = tmp_path / "dump.yaml"
    cfg.write_text("level: module\nmode: md5\nsteps: [0]\n")
    d = torchparity.dump(str(tmp_path / "d"), config=str(cfg))
    assert (d.options.level, d.options.mode, d.options.steps) == ("module", "md5", [0])


def test_start_stop_and_manual_step(tmp_path: Path) -> None:
    d = torchparity.dump(str(tmp_path / "d"), level="aten")
    d.start()
    torch.ones(3).exp()
    d.step()
    torch.ones(3).sin()
    d.stop()
    assert any(r["op"] == "aten.exp.default" for r in read_records(tmp_path / "d", 0))
    assert any(r["op"] == "aten.sin.default" for r in read_records(tmp_path / "d", 1))
    assert (tmp_path / "d" / "step1" / "rank0" / "footer.json").exists()


def test_disk_error_keeps_training_and_earlier_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from torchparity.dump import writer as writer_mod

    calls = {"n": 0}
    real = writer_mod.DumpWriter._write_batch

    def failing(self, b):  # the third batch hits a full disk
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(self, b)

    monkeypatch.setattr(writer_mod.DumpWriter, "_write_batch", failing)
    baseline = train(make_model(), make_batches(2))
    losses, out = run_dumped(tmp_path, n_steps=2, level="aten", batch_size=64)
    assert losses == baseline
    assert "No space left on device" in caplog.text and "readable" in caplog.text
    recs = read_records(out, 0)
    assert len(recs) == 128  # two complete batches survived
    footer = json.loads((out / "step0" / "rank0" / "footer.json").read_text())
    assert footer["complete"] is False and "No space" in footer["error"]


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, torch, torchparity
    from torchparity.toymodels import make_model, make_batches
    model = make_model(); (x, y), = make_batches(1)
    d = torchparity.dump(sys.argv[1], level="aten", batch_size=32, fsync=False)
    d.start()
    n = 0
    class Killer(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            global n
            n += 1
            if n == 150:
                d.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return func(*args, **(kwargs or {}))
    with Killer():
        model(x).sum().backward()
    """
)


def test_killed_process_leaves_readable_dump(tmp_path: Path) -> None:
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    out = tmp_path / "d"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    rank = out / "step0" / "rank0"
    assert not (rank / "footer.json").exists()  # not closed cleanly
    recs = [json.loads(x) for x in (rank / "records.jsonl").read_text().splitlines()]
    assert len(recs) >= 32 and recs[0]["name"].startswith("Aten.")
    assert (rank / "header.json").exists()


GLOO_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, torchparity
    rank, out, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    with torchparity.dump(out, level=sys.argv[4]):
        for _ in range(2):
            lin(torch.randn(4, 8) + rank).sum().backward()
            for p in lin.parameters():
                dist.all_reduce(p.grad)
            opt.step(); opt.zero_grad()
    dist.barrier()  # neither rank leaves while the other still talks to it
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("level", ["aten", "api"])
def test_two_process_gloo_writes_both_ranks_with_collectives(tmp_path: Path, level: str, gloo_pair) -> None:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    script = tmp_path / "gloo.py"
    script.write_text(GLOO_SCRIPT)
    codes, errs, work = gloo_pair(script, lambda r, w: [str(r), str(w / "d"), str(w / "init"), level],
                                  lambda codes, errs: codes == [0, 0])
    assert codes == [0, 0], "\n".join(f"--- rank {i} (exit {c}) ---\n{e}" for i, (c, e) in enumerate(zip(codes, errs)))
    out = work / "d"
    for rank in (0, 1):
        for step in (0, 1):
            recs = read_records(out, step, rank)
            coll = [r for r in recs if r["name"].startswith("Distributed.")]
            assert len(coll) == 2, [r["name"] for r in coll]  # weight and bias, once each (no duplicates)
            assert all(r["rank"] == rank for r in recs)
            assert coll[0].get("flags", {}).get("collective") or level == "api"
        header = json.loads((out / "step0" / f"rank{rank}" / "header.json").read_text())
        assert header["world_size"] == 2 and header["rank"] == rank


def test_torchparity_run_dumps_an_unmodified_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from torchparity.toymodels import make_model, make_batches, train\n"
        "print('LOSSES', train(make_model(), make_batches(2)))\n"
    )
    out = tmp_path / "d"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "torchparity", "run", "-o", str(out), "--level", "module", "--",
                           "python", str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "LOSSES" in proc.stdout
    baseline = train(make_model(), make_batches(2))
    assert proc.stdout.strip().endswith(str(baseline))
    names = {r["name"] for r in read_records(out, 1)}
    assert "Module.layers.0.mlp.MLP.forward.0" in names


def test_torchparity_run_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "torchparity", "run", "-o", str(tmp_path / "d"), "--phases", "sideways",
                           "--", "python", "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "phases" in proc.stderr and "Traceback" not in proc.stderr


def test_uninitialised_memory_is_described_not_measured(tmp_path: Path) -> None:
    """Model construction (empty + normal_/uniform_/fill_) dumps the same values in two runs:
    the garbage in fresh memory is never measured."""
    runs = []
    for i in range(2):
        out = tmp_path / f"init{i}"
        torch.manual_seed(0)
        del_me = torch.full((64, 64), float(i + 1))  # freed, then its memory is handed out again
        del del_me
        with torchparity.dump(str(out), level="aten"):
            junk = torch.empty(64, 64)  # uninitialised memory, different every run
            junk.normal_()
            torch.empty(8).fill_(1.0)
            make_model()
        runs.append(read_records(out))
    a, b = runs
    assert [r["name"] for r in a] == [r["name"] for r in b]
    assert {r["op"].split(".")[1] for r in a} >= {"empty", "normal_", "fill_"}
    for ra, rb in zip(a, b):
        assert [t.get("stats") for t in ra["tensors"]] == [t.get("stats") for t in rb["tensors"]], ra["name"]
    empties = [r for r in a if r["op"].startswith("aten.empty")]
    assert empties and all("stats" not in t for r in empties for t in r["tensors"] if t["io"] == "output")


def test_dump_stays_callable_after_submodule_imports(tmp_path: Path) -> None:
    import importlib

    importlib.import_module("torchparity.dump.options")  # binds the package to torchparity.dump
    with torchparity.dump(str(tmp_path / "d"), level="api"):
        torch.ones(2).add(1)
    assert (tmp_path / "d" / "step0" / "rank0" / "records.jsonl").exists()


def test_dumping_again_into_the_same_directory_replaces_the_earlier_run(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    from torchparity.dump import writer

    def run(n_steps: int) -> None:
        writer._OPENED_IN_THIS_PROCESS.clear()  # what a new process starts with
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torchparity.dump(str(tmp_path / "d"), level="api", summaries="step"):
            for _ in range(n_steps):
                model(torch.ones(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()

    run(3)
    with caplog.at_level("WARNING", logger="torchparity"):
        run(2)  # shorter: no stale step2 may remain
    assert "replaced by this run" in caplog.text
    assert sorted(x.name for x in (tmp_path / "d").iterdir() if x.is_dir()) == ["step0", "step1", "summary"]
    # the earlier run's Parquet summaries of its step 2 went with it
    assert not list((tmp_path / "d" / "summary").glob("*/step=2/*/*.parquet")), "a stale summary of the replaced run"
    recs = read_records(tmp_path / "d")
    assert len({r["id"] for r in recs}) == len(recs)
    footer = json.loads((tmp_path / "d" / "step0" / "rank0" / "footer.json").read_text())
    assert footer["records"] == len(recs)


def test_header_says_when_the_device_is_emulated(tmp_path: Path) -> None:
    from torchparity_backend_emulated import emulate

    with emulate(dtype="bfloat16"):
        with torchparity.dump(str(tmp_path / "d"), level="api"):
            torch.ones(4).mul(3)
    header = json.loads((tmp_path / "d" / "step0" / "rank0" / "header.json").read_text())
    assert header["backend"]["emulation"] is True
    assert header["backend"]["emulated_dtype"] == "bfloat16"
    with torchparity.dump(str(tmp_path / "plain"), level="api"):
        torch.ones(4).mul(3)
    header = json.loads((tmp_path / "plain" / "step0" / "rank0" / "header.json").read_text())
    assert not header["backend"].get("emulation")


def test_init_functions_do_not_measure_the_memory_they_overwrite(tmp_path: Path) -> None:
    runs = []
    for i in range(2):
        stale = torch.full((32, 32), float(i + 7))
        del stale
        torch.manual_seed(0)
        with torchparity.dump(str(tmp_path / f"i{i}"), level="api"):
            w = torch.empty(32, 32)
            torch.nn.init.kaiming_uniform_(w)
            torch.nn.init.normal_(torch.empty(8, 8), std=0.1)
        runs.append(read_records(tmp_path / f"i{i}"))
    for ra, rb in zip(*runs):
        assert [t.get("stats") for t in ra["tensors"]] == [t.get("stats") for t in rb["tensors"]], ra["name"]


def test_flush_after_stop_returns(tmp_path: Path) -> None:
    d = torchparity.dump(str(tmp_path / "d"), level="api")
    d.start()
    torch.ones(3).add(1)
    d.flush()
    d.stop()
    d.flush()  # used to wait forever on the stopped writer thread
    d.writer.flush()
    assert read_records(tmp_path / "d")


def test_a_rank_starting_leaves_the_other_ranks_fresh_step_directories(tmp_path: Path) -> None:
    """Ranks of one job start at once into one dump: a rank cleaning its earlier run out never
    removes a step directory it held nothing in (another rank may have just made it, about to make
    its own rank directory inside: a CI run lost rank 1's step 0 that way)."""
    from torchparity.dump.writer import replace_previous_run

    (tmp_path / "torchparity.json").write_text("{}")
    (tmp_path / "step0").mkdir()  # rank 1 of this run, between making step0 and step0/rank1
    (tmp_path / "step1" / "rank0").mkdir(parents=True)  # rank 0's earlier run
    assert replace_previous_run(tmp_path, 0) == 1
    assert (tmp_path / "step0").is_dir()
    assert not (tmp_path / "step1").exists()


def test_the_writer_makes_its_step_directory_again_when_it_vanished(tmp_path: Path, monkeypatch) -> None:
    """The step directory removed between its mkdir and the rank directory's (another rank's
    cleanup): made again, the records are written."""
    from torchparity.dump.writer import _make_dir

    real = Path.mkdir
    calls = {"n": 0}

    def flaky(self: Path, *a: object, **k: object) -> None:
        if self.name == "rank0" and calls["n"] == 0:
            calls["n"] += 1
            raise FileNotFoundError(2, "No such file or directory", str(self))
        real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", flaky)
    d = tmp_path / "dump"
    _make_dir(d / "step0" / "rank0")
    assert (d / "step0" / "rank0").is_dir() and calls["n"] == 1
