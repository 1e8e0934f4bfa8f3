"""The msprobe seed examples (seeds 001/003) with only the import changed, run on CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.compat.msprobe import PrecisionDebugger, compare, compare_distributed
from torchparity.toymodels import TinyConfig, make_batches, make_model, train

CFG = TinyConfig(dim=16, hidden=32, layers=1, heads=2, seq=8, batch=2, vocab=32)


def write_config(path: Path, task: str = "tensor", section: dict | None = None, **top) -> Path:
    cfg = {"task": task, "dump_path": "./npu_dump", "rank": [], "step": [], "level": "L1", "seed": 1234,
           "is_deterministic": False}
    cfg.update(top)
    cfg[task] = section if section is not None else {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}
    path.write_text(json.dumps(cfg))
    return path


def xlsx_header(path: Path) -> list:
    """Header row of the compare sheet (the one with msprobe's "NPU Name" column)."""
    import openpyxl

    for ws in openpyxl.load_workbook(path, read_only=True).worksheets:
        for row in ws.iter_rows(max_row=1, values_only=True):
            if "NPU Name" in row:
                return list(row)
    return []


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def seed_example(config: str, dump_path: str, model_fn=None) -> PrecisionDebugger:
    """Seed 001, step 2, verbatim apart from the import and the two code snippets."""
    debugger = PrecisionDebugger(config_path=config, dump_path=dump_path)
    model = make_model(cfg=CFG)
    batches = make_batches(2, cfg=CFG)
    debugger.start()
    model(batches[0][0])                       # 需要dump的代码片段1
    debugger.stop()
    debugger.start()
    model(batches[1][0]).sum().backward()      # 需要dump的代码片段2
    debugger.stop()
    debugger.step()
    debugger.close()
    return debugger


def test_seed_dump_then_compare(in_tmp):
    write_config(in_tmp / "config.json")
    seed_example("./config.json", "./npu_dump")
    seed_example("./config.json", "./bench_dump")
    df = torchparity.load_dump("./npu_dump")
    assert df["level"].eq("api").all() and df["file"].notna().any()  # L1 = api, task tensor = tensors saved
    assert {"forward", "backward"} <= set(df["phase"])
    input_param = {"npu_json_path": "./npu_dump/dump.json", "bench_json_path": "./bench_dump/dump.json",
                   "stack_json_path": "./npu_dump/stack.json", "is_print_compare_log": True}
    res = compare(input_param, output_path="./output", stack_mode=True)
    xlsx = list(Path("output").glob("compare_result_*.xlsx"))
    advisor = list(Path("output").glob("advisor_*.txt"))
    assert len(xlsx) == 1 and len(advisor) == 1 and res.root_cause is None
    header = xlsx_header(xlsx[0])
    assert "NPU_Stack_Info" in header and "NPU Name" in header


def test_stack_mode_false_drops_the_stack_column(in_tmp):
    write_config(in_tmp / "config.json", task="statistics")
    seed_example("./config.json", "./a")
    seed_example("./config.json", "./b")
    compare({"npu_json_path": "./a/dump.json", "bench_json_path": "./b/dump.json"}, output_path="./o", stack_mode=False)
    (x,) = Path("o").glob("compare_result_*.xlsx")
    header = xlsx_header(x)
    assert "NPU Name" in header and "NPU_Stack_Info" not in header


def test_stop_pauses_and_step_advances(in_tmp):
    write_config(in_tmp / "config.json", task="statistics")
    debugger = PrecisionDebugger(config_path="./config.json", dump_path="./d")
    model = make_model(cfg=CFG)
    x = make_batches(1, cfg=CFG)[0][0]
    debugger.start(); model(x); debugger.stop()
    model(x)  # not dumped
    debugger.step()
    debugger.start(); model(x); debugger.stop(); debugger.close()
    df = torchparity.load_dump("./d")
    per_step = df.groupby("step")["record_id"].nunique()
    assert list(per_step.index) == [0, 1] and per_step[0] == per_step[1]  # the un-dumped call is absent


def test_dump_path_argument_overrides_config(in_tmp):
    write_config(in_tmp / "config.json", task="statistics")
    seed_example("./config.json", "./elsewhere")
    assert Path("elsewhere/step0/rank0/records.jsonl").is_file() and not Path("npu_dump").exists()


def test_seed_and_is_deterministic_are_applied(in_tmp):
    write_config(in_tmp / "config.json", task="statistics", seed=7, is_deterministic=True)
    torch.manual_seed(0)
    try:
        PrecisionDebugger(config_path="./config.json", dump_path="./d")
        a = torch.rand(3)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    torch.manual_seed(7)
    assert torch.equal(a, torch.rand(3))


@pytest.mark.parametrize("key, value, check", [
    ("level", "L0", lambda df: df["level"].eq("module").all()),
    ("level", "L2", lambda df: df["level"].eq("aten").all()),
    ("step", [1], lambda df: df.empty),  # the seed example dumps step 0 only
    ("rank", [1], lambda df: df.empty),
])
def test_top_level_keys(in_tmp, key, value, check):
    write_config(in_tmp / "config.json", task="statistics", **{key: value})
    seed_example("./config.json", "./d")
    try:
        df = torchparity.load_dump("./d")
    except torchparity.TorchparityError:
        df = __import__("pandas").DataFrame({"step": []})
    assert check(df)


@pytest.mark.parametrize("section, check", [
    ({"scope": ["layers.0.mlp"]}, lambda df: df["module"].str.startswith("layers.0.mlp").all()),
    ({"list": ["linear"]}, lambda df: set(df["op"]) == {"torch.nn.functional.linear"}),
    ({"data_mode": ["forward"]}, lambda df: set(df["phase"]) <= {"forward", "recompute"}),
    ({"data_mode": ["input"]}, lambda df: df.loc[df["kind"].eq("tensor") & df["io"].eq("output"), "max"].isna().all()),
    ({"summary_mode": "md5"}, lambda df: df.loc[df["kind"].eq("tensor") & df["max"].notna(), "md5"].notna().all()),
])
def test_task_section_keys(in_tmp, section, check):
    write_config(in_tmp / "config.json", task="statistics", section=section)
    seed_example("./config.json", "./d")
    df = torchparity.load_dump("./d")
    assert not df.empty and check(df)


def test_list_distributed_records_only_collectives(in_tmp):
    write_config(in_tmp / "config.json", section={"scope": [], "list": ["distributed"], "data_mode": ["all"],
                                                  "summary_mode": "statistics"})
    debugger = PrecisionDebugger(config_path="./config.json", dump_path="./d")
    model = make_model(cfg=CFG)
    debugger.start(); model(make_batches(1, cfg=CFG)[0][0]); debugger.stop(); debugger.close()
    # no process group here: nothing is a collective, so nothing may be recorded
    records = list(Path("d").glob("step*/rank*/records.jsonl"))
    assert all(p.read_text().strip() == "" for p in records)


def test_overflow_check_task_reports_overflow_nums(in_tmp):
    from torchparity_backend_emulated import Fault, emulate

    write_config(in_tmp / "config.json", task="overflow_check", section={"overflow_nums": 1})
    debugger = PrecisionDebugger(config_path="./config.json", dump_path="./npu_dump")
    model = make_model(cfg=CFG)
    with emulate(dtype=None, faults=[Fault(op="silu", call=0, kind="inf", index=0, step=None)]):
        for x, _ in make_batches(2, cfg=CFG):
            debugger.start(); model(x); debugger.stop(); debugger.step()
    debugger.close()
    report = json.loads(Path("npu_dump/overflow.json").read_text())
    assert report["overflow_nums"] == 1 and len(report["overflows"]) == 1  # the limit is honoured
    assert report["overflows"][0]["module"] == "layers.0.mlp" and "silu" in report["overflows"][0]["name"]
    assert set(torchparity.load_dump("./npu_dump")["step"]) == {0}  # recording stopped after the limit


def test_compare_distributed_seed_example(in_tmp):
    for side in ("npu_dump", "gpu_dump"):
        for rank in (0, 1):
            os.environ["RANK"] = str(rank)
            try:
                write_config(in_tmp / "config.json", task="statistics")
                seed_example("./config.json", f"./{side}")
            finally:
                os.environ.pop("RANK")
    compare_distributed('./npu_dump/step0', './gpu_dump/step0', './output')
    assert list(Path("output").glob("*.xlsx"))


def test_compare_bad_input_is_a_usage_error(in_tmp):
    from torchparity.errors import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        compare({"npu_json_path": "./nope/dump.json", "bench_json_path": "./nope/dump.json"}, output_path="./o")
    with pytest.raises(UsageError, match="rank folders"):
        Path("a").mkdir(); Path("b").mkdir()
        compare_distributed("./a", "./b", "./o")


def seed_training_loop(config: str, dump_path: str, iterations: int = 3) -> None:
    """Seed 001's loop around a real training step: start / forward / backward /
    optimizer.step() / stop / step, once per iteration."""
    debugger = PrecisionDebugger(config_path=config, dump_path=dump_path)
    model = make_model(cfg=CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, _ in make_batches(iterations, cfg=CFG):
        debugger.start()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()


def test_seed_loop_with_an_optimizer_counts_each_step_once(in_tmp):
    """optimizer.step() does not advance the façade's step: only debugger.step() does."""
    write_config(in_tmp / "config.json", task="statistics")
    seed_training_loop("./config.json", "./d")
    assert sorted(p.name for p in Path("d").glob("step*")) == ["step0", "step1", "step2"]
    df = torchparity.load_dump("./d")
    assert sorted(set(df["step"])) == [0, 1, 2] and "optimizer" in set(df["phase"])


def test_step_1_of_three_iterations_dumps_step1(in_tmp):
    write_config(in_tmp / "config.json", task="statistics", step=[1])
    seed_training_loop("./config.json", "./d")
    df = torchparity.load_dump("./d")
    assert set(df["step"]) == {1} and not df.empty


def test_overflow_check_normal_run_has_no_damage_warning(in_tmp, caplog):
    """A normal start/stop/step run: no "not closed cleanly" warning, planted overflows reported."""
    import logging

    from torchparity_backend_emulated import Fault, emulate

    write_config(in_tmp / "config.json", task="overflow_check", section={"overflow_nums": -1})
    caplog.set_level(logging.WARNING, logger="torchparity")
    with emulate(dtype=None, faults=[Fault(op="silu", call=0, kind="inf", index=0, step=None)]):
        seed_training_loop("./config.json", "./npu_dump", iterations=2)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "footer" in m or "not closed cleanly" in m], messages
    report = json.loads(Path("npu_dump/overflow.json").read_text())
    assert [o["step"] for o in report["overflows"]] == [0, 1]
    first = report["overflows"][0]
    assert first["module"] == "layers.0.mlp" and "silu" in first["name"]
    assert sum("[msprobe overflow]" in m for m in messages) == 2
