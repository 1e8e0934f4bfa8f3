"""Tensor mode: each suspect op is replayed alone on its recorded device inputs in float64 and
confirmed (it introduced the error) or cleared (the error arrived from upstream)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchparity
from torchparity.compare import replay_judge
from torchparity.compare.replay_ops import CannotReplay, build_call, resolve
from torchparity.errors import UsageError


class Cancel(nn.Module):
    """``fc`` then ``h - h * 1.001``: in bfloat16 the scaling rounds away and the difference is 0,
    in float32 it is ``-0.001 h``. The forward ``sub`` is in the error model's ``cancelling`` family
    (judged against its inputs' magnitude: not a suspect); in backward, the two gradients of ``h``
    through that ``sub`` (``+g`` and ``-1.001 g``) are summed by an ``aten.add`` whose bf16 result is
    exactly 0 (fp32: ``-0.001 g``): an error of 1 from inputs off by 0.015, amplified ~67x, a
    statistics suspect, while computing exactly what its bf16 inputs give."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.out(torch.relu(h)) + (h - h * 1.001).sum() * 0.0 + (h - h * 1.001).mean()


def _run(path: Path, dtype: torch.dtype, faults: list | None = None, level: str = "aten") -> None:
    torch.manual_seed(0)
    model = Cancel().to(dtype)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    import contextlib

    outer = contextlib.nullcontext()
    if faults:  # the fault's mode is entered outside the dump: the capture sees the corrupted output
        from torchparity_backend_emulated import emulate

        outer = emulate(dtype=None, faults=faults)
    with outer, torchparity.dump(str(path), model=model, level=level, mode="tensor"):
        model(x).float().pow(2).mean().backward()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from torchparity_backend_emulated import Fault

    d = tmp_path_factory.mktemp("replay")
    _run(d / "bench", torch.float32)
    _run(d / "clean", torch.bfloat16)
    _run(d / "fault", torch.bfloat16, [Fault(op="aten.addmm*", module="out", phase="forward", kind="scale", factor=2.0)])
    # x1.05 faults: amplification ~5, below the threshold (10): found only as replayed candidates
    fwd = Fault(op="aten.addmm*", module="out", phase="forward", kind="scale", factor=1.05)
    bwd = Fault(op="aten.mm*", module="out", phase="backward", call=0, kind="scale", factor=1.05)
    _run(d / "fwd105", torch.bfloat16, [fwd])
    _run(d / "bwd105", torch.bfloat16, [bwd])
    _run(d / "api-bench", torch.float32, level="api")
    _run(d / "api-clean", torch.bfloat16, level="api")
    _run(d / "api-fwd105", torch.bfloat16, [fwd], level="api")
    _run(d / "api-bwd105", torch.bfloat16, [bwd], level="api")
    return d  # type: ignore[return-value]


def _replays(res) -> list[dict]:
    return [r for p in res.summary["pairs"] for r in p.get("replay", [])]


def test_planted_fault_is_confirmed_with_figures(dumps: Path) -> None:
    res = torchparity.compare(str(dumps / "fault"), str(dumps / "bench"))
    rc = res.root_cause
    assert rc is not None and rc.op == "aten.addmm.default" and rc.module == "out" and rc.phase == "forward"
    assert "this op introduced the error" in rc.reason
    [r] = [r for r in _replays(res) if r["name"] == rc.name]
    assert r["verdict"] == "confirmed" and r["dtype"] == "bfloat16"
    # x2 is off by 100 % = 128 ulp of bfloat16 (eps 2^-7); a correct kernel is within half an ulp
    assert 100 < r["error_ulp"] < 150 and r["cpu_ulp"] < 1 and r["tolerance_ulp"] == replay_judge.CONFIRM_ULP


def test_op_that_only_receives_an_upstream_error_is_cleared(dumps: Path) -> None:
    before = torchparity.compare(str(dumps / "clean"), str(dumps / "bench"), replay=0)
    rc = before.root_cause  # the statistics judge blames the backward add that cancels (see Cancel)
    assert rc is not None and (rc.op, rc.phase) == ("aten.add.Tensor", "backward") and rc.score >= 10, rc
    res = torchparity.compare(str(dumps / "clean"), str(dumps / "bench"))
    assert res.root_cause is None and not res.suspects, res.root_cause
    [r] = [r for r in _replays(res) if r["name"] == rc.name]
    assert r["verdict"] == "cleared" and r["dtype"] == "bfloat16"
    assert r["error_ulp"] <= 0.5 and "the divergence arrived from upstream" in r["reason"]
    assert [x["name"] for x in replay_judge.cleared(res.summary["pairs"])] == [rc.name]


def _drop_entry(dump: Path, name: str, io: str, arg: str) -> None:
    rec_file = next(dump.rglob("records.jsonl"))
    lines = []
    for line in rec_file.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("name") == name:
            rec["tensors"] = [t for t in rec["tensors"] if not (t["io"] == io and t["arg"] == arg)]
        lines.append(json.dumps(rec))
    rec_file.write_text("\n".join(lines) + "\n")


def test_missing_argument_cannot_replay_and_statistics_verdict_stands(dumps: Path, tmp_path: Path) -> None:
    import shutil

    first = torchparity.compare(str(dumps / "fault"), str(dumps / "bench"), replay=0).root_cause
    dev = tmp_path / "dev"
    shutil.copytree(dumps / "fault", dev)
    _drop_entry(dev, first.name, "input", "1")  # the addmm's input: a value the dump did not describe
    res = torchparity.compare(str(dev), str(dumps / "bench"))
    rc = res.root_cause
    assert rc is not None and rc.name == first.name  # the statistics verdict stands
    assert "cannot replay: positional argument 1 was not recorded" in rc.reason
    [r] = [r for r in _replays(res) if r["name"] == first.name]
    assert r["verdict"] == "not replayed" and r["error_ulp"] is None


def test_unknown_or_unsafe_names_are_never_resolved() -> None:
    with pytest.raises(CannotReplay, match="has no op aten.no_such_op.default"):
        resolve("aten.no_such_op.default", "aten")
    for op in ("os.system", "builtins.eval", "torch.load", "torch.save", "torch.manual_seed", "torch.nn.functional.dropout",
               "torch.Tensor.__reduce_ex__", "torch.Tensor.add_", "torch.randn", "aten.bernoulli_.float"):
        with pytest.raises(CannotReplay):
            resolve(op, "aten" if op.startswith("aten") else "api")
    assert resolve("torch.nn.functional.gelu", "api")[0] is torch.nn.functional.gelu
    assert resolve("torch.Tensor.__mul__", "api")[0] is torch.Tensor.__mul__
    with pytest.raises(CannotReplay, match="not one op"):
        resolve("Linear", "module")


def test_unreplayable_record_keeps_the_statistics_verdict(dumps: Path) -> None:
    from torchparity.dump.reader import TensorLoader, open_dump, read_unit

    frame = read_unit(open_dump(str(dumps / "fault")).unit(0, 0), [])
    rid = frame.loc[frame["op"] == "aten.addmm.default", "record_id"].iloc[-1]
    rec = frame[frame["record_id"] == rid].copy()
    rec["op"] = "aten.no_such_op.default"
    with TensorLoader() as ld:
        verdict, reason, err, *_ = replay_judge.replay_record(rec, ld.load)
    assert verdict == "not replayed" and err is None
    assert reason.startswith("cannot replay: this torch") and reason.endswith("the statistics verdict stands")


def test_required_schema_argument_missing_is_named() -> None:
    fn, schema = resolve("aten.addcdiv.default", "aten")
    entries = [{"io": "input", "arg": str(i), "kind": "tensor", "tensor": torch.ones(2), "shape": [2], "dtype": "float32"}
               for i in range(2)]
    with pytest.raises(CannotReplay, match="argument 'tensor2' of aten::addcdiv was not recorded"):
        build_call(entries, fn, schema, lambda t: t, {})


def test_replay_option_is_checked(dumps: Path) -> None:
    with pytest.raises(UsageError, match="replay must be a whole number >= 0"):
        torchparity.compare(str(dumps / "fault"), str(dumps / "bench"), replay=-1)


@pytest.mark.slow
def test_zoo_bert_clean_bf16_suspects_are_all_cleared(tmp_path: Path) -> None:
    """BERT (padding mask), one AdamW step, bf16 vs fp32 in tensor mode, aten level: the statistics
    judge suspects LayerNorm forwards and the attention key-bias gradient ``sum`` (~0 by
    cancellation under softmax: scores up to ~1e6); each replays within half an ulp, so no root
    cause, no error row, exit 0. (GPT-2, used before, no longer has a suspect in tensor mode.)"""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
    from zoo_cells import _dump
    from zoo_models import ZOO

    torch.set_num_threads(1)
    _dump(ZOO["bert"], "bf16", tmp_path / "dev", level="aten", mode="tensor")
    _dump(ZOO["bert"], "fp32", tmp_path / "bench", level="aten", mode="tensor")
    before = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"), replay=0)
    assert before.suspects, "the statistics judge suspects nothing: this test would prove nothing"
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert res.root_cause is None and not res.suspects and not res.diverged, res.root_cause
    assert res.summary["n_error"] == 0
    reps = _replays(res)
    assert {r["name"] for r in reps} >= {s.name for s in before.suspects}
    assert all(r["verdict"] == "cleared" and r["error_ulp"] < 1 for r in reps)


def _compare_cli(*args: str) -> tuple[int, str]:
    """``torchparity compare ARGS``: the exit code the console entry point would return (the command's
    return value: CliRunner's own exit_code is 0 for any return) and the output."""
    from click.testing import CliRunner

    from torchparity.cli import cli

    res = CliRunner().invoke(cli, ["compare", *args], standalone_mode=False)
    assert res.exception is None, res.output
    return res.return_value, res.output


def test_cli_replay_option(dumps: Path) -> None:
    from click.testing import CliRunner

    from torchparity.cli import cli

    code, out = _compare_cli(str(dumps / "fault"), str(dumps / "bench"))
    assert code == 1 and "root cause: Aten.addmm" in out and "this op introduced the error" in out
    code, out = _compare_cli(str(dumps / "clean"), str(dumps / "bench"))
    assert code == 0 and "cleared by replay: Aten.add.0.backward" in out and "the runs agree" in out, out
    code, out = _compare_cli(str(dumps / "fault"), str(dumps / "bench"), "--replay", "0")
    assert code == 1 and "replayed" not in out and "root cause: Aten.addmm" in out
    code, out = _compare_cli(str(dumps / "clean"), str(dumps / "bench"), "--replay", "0")
    assert code == 1 and "root cause: Aten.add.0.backward" in out and "replayed" not in out
    bad = CliRunner().invoke(cli, ["compare", str(dumps / "fault"), str(dumps / "bench"), "--replay", "-1"])
    assert bad.exit_code == 2 and "--replay" in bad.output


# ---- sub-threshold candidates, cleared rows, api level, backward ------------------------------

def _candidates(res) -> list[dict]:
    return [r for p in res.summary["pairs"] for r in p.get("replay_candidates", [])]


@pytest.mark.parametrize("case, op, phase", [("fwd105", "aten.addmm.default", "forward"),
                                             ("bwd105", "aten.mm.default", "backward")])
def test_sub_threshold_fault_is_found_by_replaying_candidates(dumps: Path, case: str, op: str, phase: str) -> None:
    """A x1.05 fault scores ~5 (< threshold 10): never a suspect; replayed as a candidate it is
    confirmed (6.4 ulp of bf16) and becomes the root cause, with op, module and phase."""
    before = torchparity.compare(str(dumps / case), str(dumps / "bench"), replay=0)
    assert before.root_cause is None or before.root_cause.op != op  # the statistics judge misses it
    res = torchparity.compare(str(dumps / case), str(dumps / "bench"))
    rc = res.root_cause
    assert rc is not None and (rc.op, rc.module, rc.phase) == (op, "out", phase), rc
    assert 2 <= rc.score < 10 and "a sub-threshold candidate" in rc.reason and "this op introduced the error" in rc.reason
    [c] = [r for r in _candidates(res) if r["name"] == rc.name]
    assert c["verdict"] == "confirmed" and 5 < c["error_ulp"] < 8  # 5 % = 6.4 ulp of bfloat16
    assert any(r["name"] == rc.name and r["candidate"] for r in _replays(res))
    assert (res.rows.loc[(res.rows["device_name"] == rc.name) & (res.rows["io"] == "output"), "verdict"] == "error").all()


def test_candidates_use_only_what_is_left_of_the_budget(dumps: Path) -> None:
    """fwd105 has one suspect (the cancelling backward add) and two candidates (the x1.05 addmm
    ~5, the pow ~2): a budget of 1 goes to the suspect; 2 adds the strongest candidate only."""
    res = torchparity.compare(str(dumps / "fwd105"), str(dumps / "bench"), replay=1)
    assert [r["op"] for r in _replays(res)] == ["aten.add.Tensor"] and not _candidates(res)
    assert res.root_cause is None  # the suspect is cleared, the budget reached no candidate
    res = torchparity.compare(str(dumps / "fwd105"), str(dumps / "bench"), replay=2)
    assert [(c["op"], c["verdict"]) for c in _candidates(res)] == [("aten.addmm.default", "confirmed")]
    assert res.root_cause is not None and res.root_cause.op == "aten.addmm.default"
    full = torchparity.compare(str(dumps / "fwd105"), str(dumps / "bench"))
    assert len(_candidates(full)) == 2  # with the default budget the weaker candidate is replayed too


def test_cleared_op_rows_become_warnings_and_the_run_agrees(dumps: Path) -> None:
    before = torchparity.compare(str(dumps / "clean"), str(dumps / "bench"), replay=0)
    name = before.root_cause.name  # the backward add (see Cancel); replay clears it
    mine = lambda res: res.rows[(res.rows["device_name"] == name) & (res.rows["io"] == "output")]  # noqa: E731
    assert (mine(before)["verdict"] == "error").any() and before.diverged
    res = torchparity.compare(str(dumps / "clean"), str(dumps / "bench"))
    rows = mine(res)
    assert (rows["verdict"] == "warning").all() and (rows["checker"] == "replay").all()
    assert rows["reason"].str.contains("arrived from upstream").all() and rows["reason"].str.contains("ulp").all()
    s = res.summary
    v = res.rows["verdict"].value_counts()
    assert s["n_error"] == v.get("error", 0) == 0 and s["n_warning"] == v.get("warning", 0)
    assert s["n_pass"] + s["n_warning"] + s["n_error"] + s["n_skip"] == s["n_rows"]
    assert not res.diverged
    code, out = _compare_cli(str(dumps / "clean"), str(dumps / "bench"))
    assert code == 0 and "the runs agree" in out, out


def test_unreplayable_op_keeps_its_error_rows(dumps: Path, tmp_path: Path) -> None:
    import shutil

    first = torchparity.compare(str(dumps / "clean"), str(dumps / "bench"), replay=0).root_cause
    dev, bench = tmp_path / "dev", tmp_path / "bench"
    shutil.copytree(dumps / "clean", dev)
    shutil.copytree(dumps / "bench", bench)
    # on both sides, so that the record keeps its shape signature and its pair (the matcher pairs
    # a group whose call-index pairs disagree in shape by shape instead)
    _drop_entry(dev, first.name, "input", "1")
    _drop_entry(bench, first.bench_name, "input", "1")
    res = torchparity.compare(str(dev), str(bench))
    assert res.root_cause is not None and res.root_cause.name == first.name
    mine = res.rows[(res.rows["device_name"] == first.name) & (res.rows["io"] == "output")]
    assert (mine["verdict"] == "error").all() and res.diverged


def test_api_level_records_are_replayed_through_the_allow_list(dumps: Path) -> None:
    """api level: a x1.05 fault in F.linear is confirmed, the ``Tensor.pow`` it feeds (a candidate:
    the loss's square doubles the relative error) is replayed through ``torch.Tensor.pow`` and cleared."""
    clean = torchparity.compare(str(dumps / "api-clean"), str(dumps / "api-bench"))
    assert clean.root_cause is None and not clean.diverged
    res = torchparity.compare(str(dumps / "api-fwd105"), str(dumps / "api-bench"))
    [p] = [r for r in replay_judge.cleared(res.summary["pairs"], candidates=True)]
    assert (p["op"], p["phase"]) == ("torch.Tensor.pow", "forward") and p["error_ulp"] <= 0.5
    rc = res.root_cause
    assert rc is not None and (rc.op, rc.module, rc.phase) == ("torch.nn.functional.linear", "out", "forward"), rc
    [c] = [r for r in _candidates(res) if r["name"] == rc.name]
    assert c["verdict"] == "confirmed" and 5 < c["error_ulp"] < 8


def test_api_level_backward_record_is_not_replayed_as_a_call(dumps: Path) -> None:
    """An api backward record holds gradients: running F.linear on them would judge a gradient
    against a forward result. It is 'cannot replay' (dump at aten level), never confirmed."""
    res = torchparity.compare(str(dumps / "api-bwd105"), str(dumps / "api-bench"))
    bw = [r for r in _candidates(res) + _replays(res) if r["phase"] == "backward"]
    assert bw and all(r["verdict"] == "not replayed" for r in bw)
    assert all("api-level backward record is the gradient of" in r["reason"] for r in bw)
    assert res.root_cause is None or res.root_cause.phase != "backward"


def test_zoo_cnn_x105_matmul_faults_are_named_and_the_clean_run_agrees(tmp_path: Path) -> None:
    """The zoo's CNN (Conv2d, BatchNorm2d, Dropout, Linear; one AdamW step), bf16 vs fp32, aten
    level, tensor mode: clean -> no root cause and no error row; x1.05 in the head's forward and
    backward matmul -> named (op, module, phase)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
    from zoo_cells import _FAULT_SITES, _dump, _pin
    from zoo_models import ZOO

    spec = ZOO["cnn"]
    _dump(spec, "fp32", tmp_path / "bench", level="aten", mode="tensor")
    _dump(spec, "bf16", tmp_path / "clean", level="aten", mode="tensor")
    clean = torchparity.compare(str(tmp_path / "clean"), str(tmp_path / "bench"))
    assert clean.root_cause is None and not clean.diverged, clean.root_cause
    assert all(r["error_ulp"] < 1 for r in replay_judge.cleared(clean.summary["pairs"], candidates=True))
    for where in ("fwd-mm", "bwd-mm"):
        op, attr, phase = _FAULT_SITES[where]
        fault = _pin(spec, "bf16", op, getattr(spec, attr), phase, tmp_path, kind="scale", factor=1.05)
        [inj] = _dump(spec, "bf16", tmp_path / where, level="aten", mode="tensor", faults=[fault])
        rc = torchparity.compare(str(tmp_path / where), str(tmp_path / "bench")).root_cause
        assert rc is not None and (rc.op, rc.module, rc.phase) == (inj.op, inj.module, phase), (where, rc)


def _scaled(path: Path, factor: float, hook: bool) -> None:
    """Two Linears, 2 SGD steps; the device run scales the first Linear's output by ``factor``:
    a Python scalar outside any module (``hook=False``), or in a forward hook (an op the benchmark
    does not run at all)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    if hook:
        m[0].register_forward_hook(lambda mod, inp, out: out * factor)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with torchparity.dump(str(path), model=m, level="aten", mode="tensor"):
        for _ in range(2):
            h = m[0](torch.randn(4, 8, generator=g))
            if not hook:
                h = h * factor
            m[1](h).sum().backward()
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("hook", [False, True])
def test_a_call_that_differs_on_identical_inputs_is_not_cleared(tmp_path: Path, hook: bool) -> None:
    """Found by a new-user check (session 15): ``h * 1.05`` against ``h * 1.0`` (or an extra
    ``* 1.05`` the benchmark does not run) on bitwise-equal inputs. The replay finds the kernel
    right on its own recorded call and used to clear it as "arrived from upstream", leaving no
    root cause (or "the runs agree", exit 0). Inputs that agree exactly cannot have brought the
    divergence: the call itself differs, and it stays the root cause."""
    _scaled(tmp_path / "bench", 1.0, hook)
    _scaled(tmp_path / "dev", 1.05, hook)
    res = torchparity.compare(str(tmp_path / "dev"), str(tmp_path / "bench"))
    assert res.root_cause is not None
    assert res.root_cause.op == "aten.mul.Tensor" and res.root_cause.step == 0 and res.root_cause.phase == "forward"
    assert "the call itself differs" in res.root_cause.reason
