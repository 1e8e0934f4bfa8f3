"""`torchparity grads`: every option validated (one line, exit 2), --plots, level L2/L0 data in
the native step files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchparity.compare._testing import run_cli
from torchparity.gradients import GradMonitor, load_run


def record(out: Path, flip_at: int | None = None, **kw) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with GradMonitor(net, out, optimizer=opt, **kw):
        for i in range(3):
            x = torch.randn(8, 6, generator=g)
            net(-x if i == flip_at else x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gcli")
    record(root / "a", level="L2", bounds=[-0.1, 0, 0.1])
    record(root / "b")
    record(root / "flip", flip_at=1)
    (root / "afile").write_text("x")
    return root


def one_line_error(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("torchparity: error: ") and "Traceback" not in out, out
    return lines[0]


@pytest.mark.parametrize("extra, fragment", [
    (["--top", "x"], "--top: 'x' is not a whole number"),
    (["--top", "-1"], "--top: must be >= 0"),
    (["--rank", "-2"], "--rank: must be >= 0"),
    (["--rank", "nan"], "--rank: 'nan' is not a whole number"),
    (["-o", "{root}/afile"], "-o {root}/afile: exists and is not a directory"),
    (["--plots", "{root}/afile"], "--plots {root}/afile: exists and is not a directory"),
    (["--plots", "{root}/afile/sub"], "cannot create the directory"),
])
def test_bad_options_are_one_line_exit_2(runs, extra, fragment):
    code, out = run_cli(["grads", str(runs / "a"), str(runs / "b"), *[e.format(root=runs) for e in extra]])
    assert code == 2 and fragment.format(root=runs) in one_line_error(out)


@pytest.mark.parametrize("a, b, fragment", [
    ("nope", "b", "no such directory"),
    ("afile", "b", "not a directory"),
    ("a", "afile", "not a directory"),
])
def test_bad_runs_are_one_line_exit_2(runs, a, b, fragment):
    code, out = run_cli(["grads", str(runs / a), str(runs / b)])
    assert code == 2 and fragment in one_line_error(out)


def test_plots_one_png_per_parameter_and_summary(runs, tmp_path):
    code, out = run_cli(["grads", str(runs / "flip"), str(runs / "b"), "--plots", str(tmp_path / "p")])
    assert code == 1 and "wrote 5 plots" in out
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert names == ["0.bias.png", "0.weight.png", "2.bias.png", "2.weight.png", "summary.png"]
    assert (tmp_path / "p" / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_plots_without_matplotlib_is_one_line(runs, tmp_path, monkeypatch):
    import sys

    for mod in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    code, out = run_cli(["grads", str(runs / "a"), str(runs / "b"), "--plots", str(tmp_path / "p")])
    assert code == 2 and "pip install matplotlib" in one_line_error(out)


def test_native_levels_store_distribution_and_md5(runs, tmp_path):
    import numpy as np

    d = load_run(runs / "a").read(0, 0)
    assert d.dist is not None and d.dist.shape == (4, 4) and np.allclose(d.dist.sum(axis=1), 1.0)
    assert load_run(runs / "a").header["bounds"] == [-0.1, 0.0, 0.1]
    assert load_run(runs / "b").read(0, 0).dist is None
    record(tmp_path / "l0", level="L0")
    md5 = load_run(tmp_path / "l0").read(0, 2).md5
    assert md5 is not None and len(md5) == 4 and all(len(m) == 32 for m in md5)


def test_native_monitor_rejects_bad_level_and_bounds(tmp_path):
    from torchparity.errors import UsageError

    net = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError, match="level"):
        GradMonitor(net, tmp_path / "x", level="L9")
    with pytest.raises(UsageError, match="increasing"):
        GradMonitor(net, tmp_path / "x", bounds=[0, 0])
    with pytest.raises(UsageError, match="optimizer"):
        GradMonitor(net, tmp_path / "x", optimizer="every")
