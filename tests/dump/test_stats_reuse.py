"""Statistics reuse at aten level: each tensor value is measured once, never a stale value.

The aten-level dump reuses the statistics of an input that an earlier op produced (or that was
measured before) when nothing wrote to it since. These tests pin the cases where reuse would be
wrong (in-place ops, writes through ``.data``/views with their own version counter) and check that
a whole training step records the same statistics with reuse on and off.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.capture.stats import host_stats
from torchparity.toymodels import make_batches, make_model, train


def _records(d: Path, step: int = 0) -> list[dict]:
    lines = (d / f"step{step}" / "rank0" / "records.jsonl").read_text().splitlines()
    return sorted((json.loads(x) for x in lines), key=lambda r: r["id"])


def _first(recs: list[dict], op: str) -> dict:
    return next(r for r in recs if r["op"].startswith(op))


def _stats(rec: dict, io: str, arg: str = "0") -> dict:
    return next(t["stats"] for t in rec["tensors"] if t["io"] == io and t["arg"] == arg)


def test_write_through_data_alias_is_not_hidden(tmp_path: Path) -> None:
    x = torch.randn(64)
    with torchparity.dump(str(tmp_path / "d"), level="aten"):
        y = x * 2                 # y measured as mul's output
        y.data.mul_(3)            # .data has its own version counter: y._version does not move
        z = y + 1                 # add must see y as it is now
        del z
    recs = _records(tmp_path / "d")
    seen = _stats(_first(recs, "aten.add.Tensor"), "input")
    assert seen["max"] == pytest.approx((x * 6).max().item(), rel=1e-6)
    assert seen["max"] != pytest.approx((x * 2).max().item(), rel=1e-3)


def test_in_place_op_remeasures_its_input_afterwards(tmp_path: Path) -> None:
    x = torch.arange(1.0, 9.0)
    with torchparity.dump(str(tmp_path / "d"), level="aten"):
        y = x.clone()
        y.add_(10)
        w = y.sum()
        del w
    recs = _records(tmp_path / "d")
    add = _first(recs, "aten.add_.Tensor")
    assert _stats(add, "input")["max"] == 8.0     # recorded before the op mutated it
    assert _stats(add, "output")["max"] == 18.0
    assert _stats(_first(recs, "aten.sum"), "input")["max"] == 18.0


def test_views_share_statistics_with_their_base(tmp_path: Path) -> None:
    w = torch.randn(16, 8)
    with torchparity.dump(str(tmp_path / "d"), level="aten"):
        wt = w.t()
        out = wt.reshape(-1).mul(2)
        del out
    recs = _records(tmp_path / "d")
    t_rec = _first(recs, "aten.t")
    assert _stats(t_rec, "output") == _stats(t_rec, "input")
    assert _stats(t_rec, "input")["norm"] == pytest.approx(torch.linalg.vector_norm(w).item(), rel=1e-6)


def test_write_to_a_view_invalidates_the_base(tmp_path: Path) -> None:
    x = torch.zeros(4, 4)
    with torchparity.dump(str(tmp_path / "d"), level="aten"):
        y = x + 1                          # y measured: max 1
        y.detach()[0].fill_(5)             # the detached view writes into y's storage
        s = y.sum()
        del s
    recs = _records(tmp_path / "d")
    assert _stats(_first(recs, "aten.sum"), "input")["max"] == 5.0


def test_training_step_statistics_same_with_and_without_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchparity.capture import aten_mode

    def run(out: Path, reuse: bool) -> list[dict]:
        if not reuse:
            orig = aten_mode.AtenCaptureMode.__init__

            def no_reuse(self, session, collectives_only=False):  # type: ignore[no-untyped-def]
                orig(self, session, collectives_only)
                session.reuse_stats = False
            monkeypatch.setattr(aten_mode.AtenCaptureMode, "__init__", no_reuse)
        with torchparity.dump(str(out), level="aten"):
            train(make_model(), make_batches(2))
        monkeypatch.undo()
        return _records(out, 1)

    a, b = run(tmp_path / "reuse", True), run(tmp_path / "plain", False)
    assert [r["name"] for r in a] == [r["name"] for r in b] and len(a) > 200
    compared = 0
    for ra, rb in zip(a, b):
        for ta, tb in zip(ra["tensors"], rb["tensors"]):
            assert (ta.get("stats") is None) == (tb.get("stats") is None), ra["name"]
            if ta.get("stats"):
                for k in ("max", "min", "mean", "norm", "nan", "inf"):
                    va, vb = ta["stats"][k], tb["stats"][k]
                    if isinstance(va, str) or isinstance(vb, str):
                        assert va == vb, (ra["name"], k)
                    else:
                        assert va == pytest.approx(vb, rel=1e-5, abs=1e-6), (ra["name"], ta["io"], ta["arg"], k)
                compared += 1
    assert compared > 500


@pytest.mark.parametrize("t", [torch.randn(300), torch.randn(30, 20).t(), torch.randn(50).half(),
                               torch.randn(50).bfloat16(), torch.arange(7), torch.tensor(2.5)])
def test_host_stats_match_definitions(t: torch.Tensor) -> None:
    got = host_stats(t)
    f = t.double()
    want = [f.max().item(), f.min().item(), f.mean().item(), torch.linalg.vector_norm(f).item(), 0, 0]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_host_stats_norm_does_not_overflow_and_counts_nonfinite() -> None:
    big = host_stats(torch.tensor([3e30, 4e30]))
    assert big is not None and big[3] == pytest.approx(5e30, rel=1e-6)  # float32 squares would be inf
    bad = host_stats(torch.tensor([float("nan"), 1.0, float("inf"), float("-inf")]))
    assert bad is not None and bad[4:] == [1.0, 2.0] and math.isnan(bad[0])


def test_in_place_result_links_to_its_producer_and_is_not_remeasured(tmp_path: Path) -> None:
    from torchparity.capture import session as session_mod

    x = torch.randn(32)
    calls: list[int] = []
    orig = session_mod.host_stats

    def counting(t: torch.Tensor):  # type: ignore[no-untyped-def]
        calls.append(t.numel())
        return orig(t)

    session_mod.host_stats = counting
    try:
        with torchparity.dump(str(tmp_path / "d"), level="aten"):
            y = x * 2
            y.add_(1)         # autograd bumps y's version after the dispatch mode returns
            z = y * 3
            del z
    finally:
        session_mod.host_stats = orig
    recs = _records(tmp_path / "d")
    add = _first(recs, "aten.add_.Tensor")
    mul2 = [r for r in recs if r["op"] == "aten.mul.Tensor"][1]
    y_in = next(t for t in mul2["tensors"] if t["io"] == "input" and t["arg"] == "0")
    assert y_in["producer"] == [add["id"], 0]
    # x, y (mul out), add_ output, z: the add_ result is reused as mul's input, not measured again
    assert len(calls) == 4


def test_tensor_mode_saves_each_value_once_and_every_entry_loads(tmp_path: Path) -> None:
    x = torch.randn(8, 4)
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="tensor"):
        y = x * 2
        yt = y.t()              # same statistics as y, but saved as itself
        yc = y.clone()          # same values and order as y: shares y's saved tensor
        yv = y.view(32)         # another shape: saved as itself
        y.add_(1)               # changed: saved again
        z = y * 3
        del yt, yc, yv, z
    df = torchparity.load_dump(str(tmp_path / "d"))
    tensors = df[df["kind"] == "tensor"]
    keys = tensors[["file", "key"]].dropna().drop_duplicates()
    assert len(keys) < len(tensors.dropna(subset=["key"]))  # some entries share a saved tensor
    clone = df[(df["op"] == "aten.clone.default")]
    assert clone.iloc[0]["key"] == clone.iloc[1]["key"] and torch.equal(clone.iloc[1]["tensor"].load(), x * 2)
    mul_in = df[(df["op"] == "aten.mul.Tensor") & (df["io"] == "input") & (df["arg"] == "0")]
    assert torch.equal(mul_in.iloc[0]["tensor"].load(), x)
    assert torch.equal(mul_in.iloc[1]["tensor"].load(), x * 2 + 1)       # after the in-place add
    t_out = df[(df["op"] == "aten.t.default") & (df["io"] == "output")].iloc[0]["tensor"].load()
    assert torch.equal(t_out, (x * 2).t())  # a transpose is saved as itself, not as its base
    view_out = df[(df["op"] == "aten.view.default") & (df["io"] == "output")]
    for _, row in view_out.iterrows():
        assert list(row["tensor"].load().shape) == list(row["shape"])


def test_shared_tensor_reference_dropped_with_its_owner_under_max_bytes(tmp_path: Path) -> None:
    x = torch.randn(64, 64)    # 16 KiB: over the budget, never saved
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="tensor", max_bytes=1024):
        y = x.neg()
        z = y.abs()            # y's entry here refers to the (unsaved) output of neg
        del z
    recs = _records(tmp_path / "d")
    for r in recs:
        for t in r["tensors"]:
            assert t.get("file") != "pending" and (t.get("file") is None) == (t.get("key") is None)


def test_md5_mode_checksums_bytes_and_names_its_algorithm(tmp_path: Path) -> None:
    from torchparity.capture.stats import CHECKSUM_ALGORITHM, tensor_checksum

    x = torch.randn(16)
    assert tensor_checksum(x) == tensor_checksum(x.clone()) != tensor_checksum(x + 1e-7 * x.abs().max())
    assert tensor_checksum(torch.randn(4, 3).t()) != "" and tensor_checksum(torch.empty(0)) == tensor_checksum(torch.empty(0, 5))
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="md5"):
        y = x * 2
        del y
    header = json.loads((tmp_path / "d" / "step0" / "rank0" / "header.json").read_text())
    assert header["checksum"] == CHECKSUM_ALGORITHM
    rec = _first(_records(tmp_path / "d"), "aten.mul.Tensor")
    out = next(t for t in rec["tensors"] if t["io"] == "output")
    assert out["md5"] == tensor_checksum(x * 2) and out["stats"]["max"] == pytest.approx((x * 2).max().item())


def test_md5_of_a_transpose_is_its_own(tmp_path: Path) -> None:
    from torchparity.capture.stats import tensor_checksum

    w = torch.randn(5, 5)
    with torchparity.dump(str(tmp_path / "d"), level="aten", mode="md5"):
        wt = w.t()
        wc = w.clone()
        del wt, wc
    recs = _records(tmp_path / "d")
    t_rec, c_rec = _first(recs, "aten.t"), _first(recs, "aten.clone")
    out = lambda r: next(t for t in r["tensors"] if t["io"] == "output")  # noqa: E731
    assert out(t_rec)["md5"] == tensor_checksum(w.t()) != tensor_checksum(w)
    assert out(c_rec)["md5"] == tensor_checksum(w) and out(t_rec)["stats"] == out(c_rec)["stats"]


@pytest.mark.parametrize("values", [[3.0], [1.0, -2.0, 0.5], [1.0, float("nan"), float("inf")], [1.0, float("inf"), float("-inf")],
                                    [float("-inf"), 2.0], list(range(32))])
def test_small_tensor_statistics_match_the_tensor_path(values: list[float]) -> None:
    from torchparity.capture.stats import stats_tensor

    t = torch.tensor(values, dtype=torch.float32)
    got, want = host_stats(t), stats_tensor(t).tolist()
    assert got is not None
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-6)


@pytest.mark.parametrize("level", ["api", "mix"])
def test_api_level_reuse_sees_python_writes(tmp_path: Path, level: str) -> None:
    x = torch.randn(32)
    with torchparity.dump(str(tmp_path / "d"), level=level, mode="md5"):
        y = torch.mul(x, 2)
        y.data.mul_(3)            # a write through an alias with its own version counter
        a = torch.add(y, 1)
        y[0] = 100.0              # __setitem__
        b = torch.add(y, 1)
        torch._foreach_add_([y], 1.0)   # no version bump at all
        c = torch.add(y, 1)
        del a, b, c
    from torchparity.capture.stats import tensor_checksum

    recs = [r for r in _records(tmp_path / "d") if r["op"] == "torch.add"]
    y_now = x * 6
    expected = []
    expected.append(y_now.clone())
    y_now[0] = 100.0
    expected.append(y_now.clone())
    expected.append(y_now + 1)
    assert len(recs) == 3
    for rec, want in zip(recs, expected):
        inp = next(t for t in rec["tensors"] if t["io"] == "input" and t["arg"] == "0")
        assert inp["md5"] == tensor_checksum(want) and inp["stats"]["max"] == pytest.approx(want.max().item())


def test_api_level_does_not_reuse_in_distributed_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # e.g. under torchrun: DDP writes gradients from C++
    d = torchparity.dump(str(tmp_path / "d"), level="api")
    d.start()
    try:
        assert d.session is not None and not d.session.reuse_stats
    finally:
        monkeypatch.setenv("WORLD_SIZE", "1")
        d.stop()


def test_expand_statistics_follow_from_the_input(tmp_path: Path) -> None:
    x = torch.tensor([[1.0], [float("inf")], [-2.0]])
    with torchparity.dump(str(tmp_path / "d"), level="aten"):
        y = x.expand(3, 4)
        z = y.sum()
        del z
    rec = _first(_records(tmp_path / "d"), "aten.expand")
    got = _stats(rec, "output")
    want = host_stats(x.expand(3, 4).contiguous())
    assert got["max"] == "Infinity" and got["min"] == -2.0 and got["inf"] == 4 and got["nan"] == 0
    x2 = torch.randn(5, 1)
    with torchparity.dump(str(tmp_path / "e"), level="aten"):
        y2 = x2.expand(5, 7)
        del y2
    got2 = _stats(_first(_records(tmp_path / "e"), "aten.expand"), "output")
    want = host_stats(x2.expand(5, 7).contiguous())
    assert [got2[k] for k in ("max", "min", "mean", "norm")] == pytest.approx(want[:4], rel=1e-6)


def test_measurements_carry_across_steps_until_written(tmp_path: Path) -> None:
    model, batches = make_model(), make_batches(3)
    params = list(model.parameters())
    from torchparity.capture import session as session_mod

    measured_params: dict[int, int] = {}
    orig = session_mod.host_stats
    d = torchparity.dump(str(tmp_path / "d"), level="aten")

    def counting(t: torch.Tensor):  # type: ignore[no-untyped-def]
        if any(t is p for p in params):
            step = d.session.step if d.session else -1
            measured_params[step] = measured_params.get(step, 0) + 1
        return orig(t)

    session_mod.host_stats = counting
    try:
        with d:
            train(model, batches)
    finally:
        session_mod.host_stats = orig
    # step 0 measures the parameters when it first reads them, and again after the optimizer
    # wrote them; steps 1 and 2 read them unchanged from step 0's optimizer and never re-measure
    # before their own optimizer writes them
    assert measured_params.get(0, 0) >= len(params)
    recs = _records(tmp_path / "d", 1)
    first_reads = [r for r in recs if r["op"] == "aten.t.default" and r["phase"] == "forward"]
    assert first_reads and all(_stats(r, "input")["norm"] > 0 for r in first_reads)
    assert measured_params.get(1, 0) <= measured_params.get(0, 0) - len(params)


def test_a_view_is_measured_once_and_links_to_the_view_op(tmp_path: Path) -> None:
    """A view op's output shares its base's version counter only after the dispatch mode returned
    (the ADInplaceOrView kernel sits above the mode). Remembered at the counter it had inside the
    mode (0), the transpose of a trained weight (version > 0) was measured again when the matmul
    read it, and the matmul's input had no producer link."""
    from torchparity.capture import session as session_mod

    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    views_of_weight: list[int] = []
    orig = session_mod.host_stats

    def counting(t: torch.Tensor):  # type: ignore[no-untyped-def]
        if t._base is lin.weight:
            views_of_weight.append(t.numel())
        return orig(t)

    session_mod.host_stats = counting
    try:
        with torchparity.dump(str(tmp_path / "d"), model=lin, level="aten"):
            for _ in range(3):  # the optimizer moves the weight's version counter past 0
                lin(x).square().sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        session_mod.host_stats = orig
    assert lin.weight._version > 0
    assert views_of_weight == []
    recs = _records(tmp_path / "d", 2)
    t_rec = next(r for r in recs if r["op"] == "aten.t.default" and r["phase"] == "forward")
    mm = next(r for r in recs if r["op"] in ("aten.addmm.default", "aten.mm.default") and r["phase"] == "forward")
    linked = [t.get("producer") for t in mm["tensors"] if t["io"] == "input"]
    assert [t_rec["id"], 0] in linked, linked


def test_a_detached_gradient_is_not_measured_again_by_the_optimizer(tmp_path: Path) -> None:
    """AccumulateGrad sets ``.grad`` to a detached alias of the backward op's output (an
    unrecorded op): the optimizer reads the values the backward op's record measured."""
    from torchparity.capture import session as session_mod

    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    d = torchparity.dump(str(tmp_path / "d"), model=lin, level="aten")
    grads_in_optimizer: list[int] = []
    orig = session_mod.host_stats

    def counting(t: torch.Tensor):  # type: ignore[no-untyped-def]
        if d.session is not None and d.session.in_optimizer and \
                any(p.grad is not None and t.data_ptr() == p.grad.data_ptr() for p in lin.parameters()):
            grads_in_optimizer.append(t.numel())
        return orig(t)

    session_mod.host_stats = counting
    try:
        with d:
            for _ in range(2):
                lin(x).square().sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        session_mod.host_stats = orig
    assert grads_in_optimizer == []
    recs = _records(tmp_path / "d", 1)
    upd = [r for r in recs if r["phase"] == "optimizer" and r["op"].startswith("aten.add_")]
    assert upd and all(any(t["io"] == "input" and t.get("stats") for t in r["tensors"]) for r in upd)
