"""torchparity.bisect on the emulated bf16 device: finds the planted softmax, leaves a clean pair
alone, and refuses bad input with one line (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torchparity_backend_emulated")

import torchparity  # noqa: E402
from torchparity.bisect.search import minimal_set  # noqa: E402
from torchparity.cli import main  # noqa: E402
from torchparity.errors import UsageError  # noqa: E402

SCRIPT = str(Path(__file__).with_name("softmax_script.py"))


def test_finds_the_softmax_module_and_op(tmp_path: Path) -> None:
    rep = torchparity.bisect(SCRIPT, entry="main", output_dir=tmp_path)
    assert rep.verdict == "culprit"
    assert rep.culprit_modules == ["5"]  # the block fed logits near 256
    assert any("Aten._softmax" in o for o in rep.culprit_ops) and len(rep.culprit_ops) <= 2
    assert all(o.startswith("5: ") for o in rep.culprit_ops)
    assert rep.baseline_error > rep.tolerance >= rep.error_after_promotion
    n = rep.n_modules
    assert rep.reruns <= 2 * math.log2(n) + 4
    data = json.loads((tmp_path / "bisect-report.json").read_text())
    assert data["culprit_ops"] == rep.culprit_ops and data["reruns"] == rep.reruns and data["path"]


def test_a_later_step_is_bisected() -> None:
    rep = torchparity.bisect(SCRIPT, entry="steps", step=1)
    assert rep.verdict == "culprit" and rep.culprit_modules == ["5"]


def test_clean_pair_has_nothing_to_bisect(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["bisect", SCRIPT, "--entry", "clean", "-o", str(tmp_path)])
    assert ex.value.code == 0
    assert "no divergence to bisect" in capsys.readouterr().out
    assert json.loads((tmp_path / "bisect-report.json").read_text())["culprit_ops"] == []


@pytest.mark.parametrize("args, words", [
    (["missing.py"], "does not exist"),
    ([SCRIPT, "--entry", "nope"], "has no function 'nope'"),
    ([SCRIPT, "--entry", "steps", "--step", "2"], "step 2 is out of range"),
    ([SCRIPT, "--step", "1"], "step 1 is out of range"),
    ([SCRIPT, "--target", "gpu"], "target must be one of"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], words: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["bisect", *args, "-o", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert ex.value.code == 2 and words in err and "\n" not in err and "Traceback" not in err


def test_search_cost_is_logarithmic() -> None:
    for n in (8, 32, 128):
        for culprit in (0, n // 3, n - 1):
            calls = []

            def fixes(sel: list) -> bool:
                calls.append(sel)
                return culprit in sel

            assert minimal_set(list(range(n)), fixes) == [culprit]
            assert len(calls) <= math.log2(n) + 1


def test_two_culprits_are_both_found() -> None:
    assert sorted(minimal_set(list(range(32)), lambda s: {3, 20} <= set(s))) == [3, 20]


def test_bad_step_raises_usage_error() -> None:
    with pytest.raises(UsageError):
        torchparity.bisect(SCRIPT, entry="main", step=-1)


def test_promotion_changes_only_the_promoted_ops() -> None:
    import torch
    from torchparity_backend_emulated import emulate

    from torchparity.bisect.promote import _upcast

    x = torch.randn(64, 64)
    with emulate(dtype="bfloat16"):
        plain = torch.softmax(x @ x + 256, -1)
    with emulate(dtype="bfloat16", promote=lambda c: False):
        none = torch.softmax(x @ x + 256, -1)
    with emulate(dtype="bfloat16", promote=lambda c: True):
        every = torch.softmax(x @ x + 256, -1)
    with emulate(dtype="bfloat16", promote=lambda c: c.info.base == "_softmax"):
        only_softmax = torch.softmax(x @ x + 256, -1)
    assert torch.equal(plain, none)  # nothing promoted: bitwise the emulated run
    assert torch.equal(every, torch.softmax(x @ x + 256, -1))  # everything: bitwise the fp32 run
    with emulate(dtype="bfloat16"):
        mm_add = (x @ x) + 256  # matmul and add rounded, the softmax computed in fp32
    assert torch.equal(only_softmax, torch.softmax(mm_add, -1)) and not torch.equal(only_softmax, plain)

    # native: the upcasting consumer computes the chosen ops in fp32 and keeps the tensors' dtypes
    b = torch.randn(8, 8).to(torch.bfloat16)
    seen: list[str] = []
    with _upcast(lambda c: seen.append(c.info.base) or c.info.base == "mul", torch.float32):
        y = b * 3.3 + 1
    assert y.dtype == torch.bfloat16 and "mul" in seen
    assert torch.equal(y, ((b.float() * 3.3).to(torch.bfloat16) + 1))


def test_native_target_says_storage_not_compute() -> None:
    rep = torchparity.bisect(SCRIPT, entry="native", target="native")
    assert rep.verdict == "not_precision" and rep.culprit_ops == []
    assert "not a problem of how ops compute" in rep.summary()


def test_report_carries_the_compare_root_cause(tmp_path: Path) -> None:
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    rc = {"name": "Aten._softmax.5.forward", "op": "aten._softmax.default", "module": "5", "phase": "forward",
          "step": 0, "rank": 0, "index": 12, "score": 40.0}
    (cmp / "compare.json").write_text(json.dumps({"format": "torchparity-compare", "root_cause": rc}))
    rep = torchparity.bisect(SCRIPT, entry="clean", compare_dir=cmp)
    assert rep.compare_root_cause["name"] == "Aten._softmax.5.forward"
    assert "compare's root cause: Aten._softmax.5.forward in 5" in rep.summary()
    assert rep.compare_agreement is None  # nothing to bisect: nothing to confirm
    rep = torchparity.bisect(SCRIPT, entry="main", compare_dir=cmp)
    assert rep.compare_agreement == "confirmed" and "confirmed by experiment" in rep.summary()
    with pytest.raises(UsageError, match="has no compare.json"):
        torchparity.bisect(SCRIPT, entry="clean", compare_dir=tmp_path)


def test_search_stops_at_max_culprits_when_many_units_are_needed() -> None:
    from torchparity.bisect.search import Diffuse

    calls = []

    def fixes(sel: list) -> bool:  # every unit is needed
        calls.append(sel)
        return len(sel) == 64

    with pytest.raises(Diffuse) as ei:
        minimal_set(list(range(64)), fixes, max_culprits=5)
    assert ei.value.found == [63, 62, 61, 60, 59]
    assert len(calls) <= 5 * (math.log2(64) + 1)
    assert minimal_set(list(range(32)), lambda s: {3, 20} <= set(s), max_culprits=2) in ([20, 3], [3, 20])


def test_a_divergence_spread_over_every_block_is_diffuse_not_a_long_search(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """32 blocks that each add a little bf16 error: the search stops after --max-culprits modules
    (it took 411 re-runs before the bound) with verdict diffuse, exit 1, and says why."""
    script = str(Path(__file__).with_name("diffuse_script.py"))
    with pytest.raises(SystemExit) as ex:
        main(["bisect", script, "--max-culprits", "4", "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert ex.value.code == 1
    data = json.loads((tmp_path / "bisect-report.json").read_text())
    assert data["verdict"] == "diffuse" and len(data["culprit_modules"]) == 4
    assert data["error_after_promotion"] > data["tolerance"]
    assert data["reruns"] <= 1 + 4 * (math.ceil(math.log2(data["n_modules"])) + 1)
    assert "no small culprit set: 4 modules" in out and "spread over many modules" in out
    with pytest.raises(UsageError, match="max culprits"):
        torchparity.bisect(script, max_culprits=0)


def _compare_dir(tmp_path: Path, module: str, name: str) -> Path:
    d = tmp_path / f"cmp-{module}"
    d.mkdir()
    (d / "compare.json").write_text(json.dumps({"root_cause": {
        "name": name, "op": "aten._softmax.default", "module": module, "phase": "forward", "step": 0, "rank": 0}}))
    return d


def test_the_compares_root_cause_is_tried_first_and_saves_the_module_search(tmp_path: Path) -> None:
    """With --compare, the root cause's module is promoted alone first: it fixes, so it is the
    culprit module in one re-run; its op alone does not (the add before it rounds too), so the op
    search goes on. A wrong hint costs one re-run and changes no answer."""
    plain = torchparity.bisect(SCRIPT, entry="main")
    hinted = torchparity.bisect(SCRIPT, entry="main", compare_dir=_compare_dir(tmp_path, "5", "Aten._softmax.5.forward"))
    wrong = torchparity.bisect(SCRIPT, entry="main", compare_dir=_compare_dir(tmp_path, "2", "Aten._softmax.2.forward"))
    assert plain.culprit_modules == hinted.culprit_modules == wrong.culprit_modules == ["5"]
    assert sorted(plain.culprit_ops) == sorted(hinted.culprit_ops) == sorted(wrong.culprit_ops)
    assert hinted.path[1]["level"] == "modules (compare's root cause)" and hinted.path[1]["fixed"] is True
    assert hinted.path[2]["level"] == "ops (compare's root cause)" and hinted.path[2]["fixed"] is False
    assert hinted.reruns < plain.reruns
    assert wrong.path[1]["fixed"] is False and wrong.reruns <= plain.reruns + 2
    assert hinted.compare_agreement == "confirmed"


def test_a_wrong_device_kernel_is_found_by_promoting_to_the_reference_backend(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture) -> None:
    """A planted kernel fault (block 3's softmax on the emulated device): a higher precision does
    not remove it (not_precision, and the summary says what to try); computing the promoted ops on
    the CPU reference does, and the bisect names that op alone."""
    prec = torchparity.bisect(SCRIPT, entry="faulty", target="native")
    assert prec.verdict == "not_precision"
    assert "--promote-backend cpu" in prec.summary()
    with pytest.raises(SystemExit) as ex:
        main(["bisect", SCRIPT, "--entry", "faulty", "--target", "native", "--promote-backend", "cpu",
              "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert ex.value.code == 1 and "promoting them to the cpu backend" in out
    data = json.loads((tmp_path / "bisect-report.json").read_text())
    assert data["verdict"] == "culprit" and data["promote_backend"] == "cpu"
    assert data["culprit_modules"] == ["3"] and data["culprit_ops"] == ["3: Aten._softmax.3.forward"]
    assert data["error_after_promotion"] <= data["tolerance"]
    for name, words in (("emulated", "is an emulation"), ("abacus", "unknown promote backend")):
        with pytest.raises(UsageError, match=words):
            torchparity.bisect(SCRIPT, entry="faulty", target="native", promote_backend=name)


def test_promotion_to_the_reference_writes_in_place_results_back() -> None:
    """An in-place op promoted to the reference: the caller's tensor holds the result, and is what
    the op returns."""
    import torch

    from torchparity.bisect.promote_reference import on_reference

    x = torch.ones(3)
    with on_reference(lambda c: True, torch.device("cpu")):
        y = x.add_(2)
        z = torch.mul(x, 2)
    assert y is x and torch.equal(x, torch.full((3,), 3.0)) and torch.equal(z, torch.full((3,), 6.0))


def test_an_op_the_reference_cannot_run_runs_on_the_device_and_is_reported() -> None:
    """A promoted op whose reference run fails (here: the meta device, whose results cannot come
    back) runs on the device as without promotion, and is counted as not promoted."""
    import torch

    from torchparity.bisect.promote_reference import on_reference

    x = torch.arange(4.0)
    missed: dict[str, int] = {}
    with on_reference(lambda c: True, torch.device("meta"), missed):
        y = torch.mul(x, 2)
        x.add_(1)
    assert torch.equal(y, torch.arange(4.0) * 2) and torch.equal(x, torch.arange(4.0) + 1)
    assert missed and all(n >= 1 for n in missed.values())
    assert any("mul" in k for k in missed) and any("add" in k for k in missed)


def test_the_report_lists_ops_that_ran_unpromoted(tmp_path: Path) -> None:
    from torchparity.bisect.report import BisectReport

    rep = BisectReport(verdict="culprit", script="s.py", entry="main", step=0, target="native",
                       promote_dtype="float32", tolerance=0.01, baseline_error=0.1, error_after_promotion=0.001,
                       culprit_modules=["a"], culprit_ops=["a: Aten.mm.0.forward"],
                       not_promoted={"a: Aten.mm.0.forward": 3})
    assert "1 op(s) chosen for promotion ran unpromoted" in rep.summary()
    assert json.loads(json.dumps(rep.to_dict()))["not_promoted"] == {"a: Aten.mm.0.forward": 3}
