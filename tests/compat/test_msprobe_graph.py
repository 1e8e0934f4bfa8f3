"""Seed 003 (msprobe's hierarchical graph): `msprobe -f pytorch graph -i compare.json -o out`
becomes `python -m torchparity.compat.msprobe -f pytorch graph -i compare.json -o out`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.compat import msprobe
from torchparity.errors import UsageError
from torchparity.toymodels import make_batches, make_model, train


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from torchparity_backend_emulated import Fault, emulate

    root = tmp_path_factory.mktemp("graph")
    torch.manual_seed(0)
    with torchparity.dump(str(root / "bench"), level="mix"):
        train(make_model(), make_batches(1))
    torch.manual_seed(0)
    with emulate(faults=[Fault(op="aten.mm", module="layers.1.mlp.down_proj", phase="forward", step=0,
                               kind="scale", factor=1.5)]):
        with torchparity.dump(str(root / "npu"), level="mix"):
            train(make_model(), make_batches(1))
    return root / "npu", root / "bench"


def test_seed_command_line_compares_and_marks_the_root_cause(dumps: tuple[Path, Path], tmp_path: Path) -> None:
    npu, bench = dumps
    cfg = tmp_path / "compare.json"
    cfg.write_text(json.dumps({"npu_path": str(npu), "bench_path": str(bench), "is_print_compare_log": True}))
    p = subprocess.run([sys.executable, "-m", "torchparity.compat.msprobe", "-f", "pytorch", "graph",
                        "-i", str(cfg), "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    pages = sorted((tmp_path / "out").glob("compare_*_step0_rank0.vis.html"))
    assert len(pages) == 1 and "[msprobe graph] step 0 rank 0" in p.stdout
    data = json.loads(pages[0].with_suffix("").with_suffix(".vis.json").read_text())
    assert data["root_cause"] == "R:Functional.linear.13.forward"  # the linear inside down_proj, step 0


def test_build_only_without_bench_path(dumps: tuple[Path, Path], tmp_path: Path) -> None:
    npu, _ = dumps
    pages = msprobe.graph({"npu_path": str(npu), "is_print_compare_log": False}, tmp_path / "out")
    assert [p.name.split("_")[0] for p in pages] == ["build"]
    assert "<html" in pages[0].read_text().lower()


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="npu_path"):
        msprobe.graph({"bench_path": "x"}, tmp_path)
    with pytest.raises(UsageError, match="unknown key"):
        msprobe.graph({"npu_path": "x", "typo": 1}, tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        msprobe.graph(tmp_path / "missing.json", tmp_path)
    p = subprocess.run([sys.executable, "-m", "torchparity.compat.msprobe", "-f", "pytorch", "graph",
                        "-i", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr


class _Net(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.add_module(name, torch.nn.Linear(8, 8))
        self.head = torch.nn.Linear(8, 2)
        self._name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(getattr(self, self._name)(x)))


def test_layer_mapping_pairs_renamed_modules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for side, name in (("npu", "dense"), ("bench", "fc")):
        with torchparity.dump(str(tmp_path / side), level="mix"):
            _Net(name)(torch.ones(2, 8)).sum().backward()
    cfg = {"npu_path": str(tmp_path / "npu"), "bench_path": str(tmp_path / "bench"), "is_print_compare_log": False}
    mapping = tmp_path / "map.yaml"
    mapping.write_text("dense: fc\n")

    def unmatched(g: Path) -> int:
        data = json.loads(g.with_suffix("").with_suffix(".vis.json").read_text())
        return sum(1 for n in data["nodes"].values() if n.get("status") == "unmatched") if isinstance(data["nodes"], dict) \
            else sum(1 for n in data["nodes"] if n.get("status") == "unmatched")

    without = msprobe.graph(cfg, tmp_path / "a")
    with_map = msprobe.graph(cfg, tmp_path / "b", layer_mapping=str(mapping))
    assert unmatched(without[0]) > 0 and unmatched(with_map[0]) == 0
    assert "[msprobe graph]" not in capsys.readouterr().out  # is_print_compare_log: false
