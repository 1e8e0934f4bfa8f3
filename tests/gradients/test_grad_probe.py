"""msprobe's gradient probe (seed 004) through the façade, on the native GradMonitor: every
config key, the seed's files and columns, GradComparator, numerics untouched."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from torchparity.compat.msprobe import GradComparator, PrecisionDebugger
from torchparity.errors import UsageError

STEPS = 3


def make_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def train(net: torch.nn.Module, steps: int = STEPS, scale_at: int | None = None) -> list[dict[str, torch.Tensor]]:
    """SGD steps; returns each step's gradients (read after backward, before the optimizer)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    grads = []
    for i in range(steps):
        x = torch.randn(8, 6, generator=g)
        x[:, 0] = 0  # the first input feature is 0: its weights' gradients are exactly 0
        if scale_at is not None and i == scale_at:
            x = -x
        net(x).pow(2).mean().backward()
        grads.append({n: p.grad.detach().clone() for n, p in net.named_parameters()})
        opt.step()
        opt.zero_grad()
    return grads


def config(path: Path, dump_path: str = "./dump_path", section: dict | None = None, **top) -> str:
    cfg = {"task": "grad_probe", "dump_path": dump_path, "rank": [], "step": [],
           "grad_probe": {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}}
    cfg["grad_probe"].update(section or {})
    cfg.update(top)
    path.write_text(json.dumps(cfg))
    return str(path)


def probe(cfg: str, scale_at: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Seed 004's code: PrecisionDebugger(config).monitor(model), then the usual training."""
    net = make_net()
    debugger = PrecisionDebugger(cfg)
    debugger.monitor(net)
    grads = train(net, scale_at=scale_at)
    debugger.stop()
    return grads


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.open(encoding="utf-8")))
    return rows[0], rows[1:]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_seed_example_l1_files_and_columns(in_tmp):
    grads = probe(config(in_tmp / "config.json"))
    rank = Path("dump_path/rank0")
    assert sorted(p.name for p in rank.glob("grad_summary_*.csv")) == [f"grad_summary_{s}.csv" for s in range(STEPS)]
    head, rows = read_csv(rank / "grad_summary_1.csv")
    assert head == ["param_name", "max", "min", "norm", "shape"]
    g = grads[1]
    by_name = {r[0]: r for r in rows}
    assert set(by_name) == set(g)
    w = g["0.weight"]
    assert float(by_name["0.weight"][1]) == pytest.approx(w.max().item())
    assert float(by_name["0.weight"][2]) == pytest.approx(w.min().item())
    assert float(by_name["0.weight"][3]) == pytest.approx(w.norm().item(), rel=1e-6)
    assert by_name["0.weight"][4] == "[5, 6]"
    for s in range(STEPS):  # direction data: the gradient's signs, as bool arrays
        for name, grad in grads[s].items():
            arr = np.load(rank / f"step{s}" / f"{name}.npy", allow_pickle=False)
            assert arr.dtype == bool and np.array_equal(arr, (grad > 0).numpy())


def test_grad_level_l0_has_md5_and_no_direction(in_tmp):
    grads = probe(config(in_tmp / "config.json", section={"grad_level": "L0"}))
    head, rows = read_csv(Path("dump_path/rank0/grad_summary_0.csv"))
    assert head == ["param_name", "MD5", "max", "min", "norm", "shape"]
    md5 = {r[0]: r[1] for r in rows}
    for name, g in grads[0].items():
        assert md5[name] == hashlib.md5(g.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    assert not list(Path("dump_path/rank0").glob("step*/*.npy"))


@pytest.mark.parametrize("bounds", [[-1, 0, 1], [-0.05, 0, 0.05]])
def test_grad_level_l2_bounds_intervals_and_zero_ratio(in_tmp, bounds):
    grads = probe(config(in_tmp / "config.json", section={"grad_level": "L2", "bounds": bounds}))
    head, rows = read_csv(Path("dump_path/rank0/grad_summary_2.csv"))
    b = [f"{float(x):g}" for x in bounds]
    intervals = [f"(-inf, {b[0]}]", f"({b[0]}, {b[1]}]", f"({b[1]}, {b[2]}]", f"({b[2]}, inf)"]
    assert head == ["param_name", *intervals, "=0", "max", "min", "norm", "shape"]
    for r in rows:
        g = grads[2][r[0]].reshape(-1).numpy().astype(np.float64)
        edges = [-np.inf, *bounds, np.inf]
        want = [np.mean((g > lo) & (g <= hi)) for lo, hi in zip(edges, edges[1:])]
        assert [float(x) for x in r[1:5]] == pytest.approx(want)
        assert float(r[5]) == pytest.approx(np.mean(g == 0))
    relu_rows = {r[0]: r for r in rows}
    assert float(relu_rows["0.weight"][5]) >= 1 / 6  # a zero input column: the =0 ratio sees its weights
    assert list(Path("dump_path/rank0/step2").glob("*.npy"))  # L2 has direction data


def test_param_list_step_rank_and_dump_path(in_tmp):
    probe(config(in_tmp / "c1.json", dump_path="./only", section={"param_list": ["2.weight"]}, step=[1, "2-2"]))
    assert sorted(p.name for p in Path("only/rank0").glob("grad_summary_*.csv")) == ["grad_summary_1.csv", "grad_summary_2.csv"]
    _, rows = read_csv(Path("only/rank0/grad_summary_1.csv"))
    assert [r[0] for r in rows] == ["2.weight"]
    assert [p.name for p in Path("only/rank0/step1").iterdir()] == ["2.weight.npy"]
    assert not Path("dump_path").exists()  # dump_path is where everything goes
    probe(config(in_tmp / "c2.json", dump_path="./other_rank", rank=[1]))
    assert not list(Path("other_rank").glob("rank*"))  # this process is rank 0: not monitored


def test_monitoring_does_not_change_training(in_tmp):
    plain = make_net()
    train(plain)
    probe(config(in_tmp / "config.json", section={"grad_level": "L2"}))
    probed = make_net()
    d = PrecisionDebugger(config(in_tmp / "c.json", dump_path="./d2", section={"grad_level": "L0"}))
    d.monitor(probed)
    train(probed)
    d.stop()
    for (n, a), (_, b) in zip(plain.state_dict().items(), probed.state_dict().items()):
        assert torch.equal(a, b), n


def test_grad_comparator_identical_and_drifted(in_tmp):
    probe(config(in_tmp / "a.json", dump_path="./npu"))
    probe(config(in_tmp / "b.json", dump_path="./gpu"))
    probe(config(in_tmp / "c.json", dump_path="./bad"), scale_at=1)
    res = GradComparator.compare_distributed("./npu", "./gpu", "./same")
    table = res["tables"][0]
    assert (table.to_numpy() == 1.0).all() and list(table.index)[-1] == "summary"
    head, rows = read_csv(Path("same/similarities.csv"))  # one rank: no rank{R} level
    assert head == ["step", "0", "1", "2"] and rows[-1][0] == "summary"
    pics = {p.name for p in Path("same/similarities_picture").iterdir()}
    assert {"summary_similarities.png", "0.weight.png", "2.bias.png"} <= pics
    assert Path("same/similarities_picture/summary_similarities.png").read_bytes()[:4] == b"\x89PNG"
    t = GradComparator.compare_distributed("./npu", "./bad", "./diff")["tables"][0]
    assert t.loc["summary", 0] == 1.0 and t.loc["summary", 1] < 0.97  # the flipped step is seen


def test_grad_comparator_per_rank_folders(in_tmp, monkeypatch):
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        probe(config(in_tmp / "a.json", dump_path="./npu"))
        probe(config(in_tmp / "b.json", dump_path="./gpu"))
    monkeypatch.delenv("RANK")
    GradComparator.compare_distributed("./npu", "./gpu", "./out")
    assert Path("out/rank0/similarities.csv").is_file() and Path("out/rank1/similarities_picture/summary_similarities.png").is_file()


def test_grad_comparator_bad_input_and_missing_matplotlib(in_tmp, monkeypatch):
    import sys

    probe(config(in_tmp / "a.json", dump_path="./npu"))
    probe(config(in_tmp / "l0.json", dump_path="./l0", section={"grad_level": "L0"}))
    with pytest.raises(UsageError, match="L1 or L2"):
        GradComparator.compare_distributed("./npu", "./l0", "./o")
    with pytest.raises(UsageError, match="not a directory"):
        GradComparator.compare_distributed("./npu", "./a.json", "./o")
    for mod in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)  # as if matplotlib were not installed
    with pytest.raises(UsageError, match="pip install matplotlib"):
        GradComparator.compare_distributed("./npu", "./npu", "./o")
    Path("npu/rank0/step0/0.weight.npy").write_bytes(b"\x93NUMPY garbage")
    from torchparity.errors import DumpError

    with pytest.raises(DumpError, match="0.weight.npy"):
        GradComparator.compare_distributed("./npu", "./npu", "./o2")


@pytest.mark.parametrize("section, top, match", [
    ({"grad_level": "L3"}, {}, "grad_level"),
    ({"bounds": [1, 0]}, {}, "increasing"),
    ({"bounds": [0, "x"]}, {}, "bounds"),
    ({"bounds": [0, float("nan")]}, {}, "bounds"),
    ({"param_list": "fc.weight"}, {}, "param_list"),
    ({"nosuch": 1}, {}, "nosuch"),
    ({}, {"scope": []}, "scope"),
    ({}, {"step": ["x"]}, "step"),
    ({}, {"dump_path": ""}, "dump_path"),
])
def test_bad_config_is_one_clear_error(in_tmp, section, top, match):
    with pytest.raises(UsageError, match=match):
        PrecisionDebugger(config(in_tmp / "config.json", section=section, **top))


def test_monitor_needs_grad_probe_and_a_module(in_tmp):
    d = PrecisionDebugger(config(in_tmp / "config.json"))
    with pytest.raises(UsageError, match="torch.nn.Module"):
        d.monitor(object())
    (in_tmp / "s.json").write_text(json.dumps({"task": "statistics", "dump_path": "./x"}))
    with pytest.raises(UsageError, match="grad_probe"):
        PrecisionDebugger(str(in_tmp / "s.json")).monitor(make_net())
