"""Shared helpers of the graph tests: small TinyLlama dumps and an in-process CLI runner."""

from __future__ import annotations

from pathlib import Path

import torchparity
from torchparity.cli import cli
from torchparity.toymodels import TinyConfig, make_batches, make_model, train

SMALL = TinyConfig(vocab=64, dim=32, layers=2, heads=4, hidden=64, seq=8, batch=2)
FAULT_MODULE = "layers.1.mlp.down_proj"


def _dump(path: Path, fault: bool | str = False, extra_clone_in: str | None = None, extra_op: str = "clone",
          level: str = "mix", dtype: str | None = None) -> Path:
    from torchparity_backend_emulated import Fault, emulate

    model = make_model(0, SMALL)
    batches = make_batches(1, cfg=SMALL)
    handle = None
    if extra_clone_in is not None:  # an extra (exact) op on this side only
        hook = (lambda m, i, o: o.clone()) if extra_op == "clone" else (lambda m, i, o: o * 1.0)
        handle = model.get_submodule(extra_clone_in).register_forward_hook(hook)
    faults = [Fault(op="aten.mm", module=FAULT_MODULE, phase="forward", step=0, kind="nan" if fault == "nan" else "scale", factor=1.5)] if fault else []
    with emulate(dtype=dtype, faults=faults) as dev:
        with torchparity.dump(str(path), level=level, mode="statistics", model=model, fsync=False):
            train(model, batches)
    if handle is not None:
        handle.remove()
    assert not fault or dev.injections, "the planted fault never fired"
    return path


def run_cli(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import click

        from torchparity.errors import TorchparityError

        if isinstance(res.exception, click.ClickException):  # click's own option checks: exit 2
            return res.exception.exit_code, res.exception.format_message()
        assert isinstance(res.exception, TorchparityError), repr(res.exception)
        return res.exception.exit_code, str(res.exception)
    return (res.return_value if isinstance(res.return_value, int) else 0), res.output


