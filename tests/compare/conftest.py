"""Fixtures for the compare tests: TinyLlama dumps with one planted fault.

The fault is planted by a test-local TorchDispatchMode entered *outside* the dump, so the dump's
capture modes (inner) see the corrupted output exactly like they would see a device's wrong
result. Calls are counted per op and phase the way the dump names aten records
(``Aten.mm.5.forward`` is the sixth ``aten.mm`` call of the forward), and torchparity's own
computation (statistics, checksums) is never counted or touched.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchparity
from torchparity.capture.session import tool_is_busy
from torchparity.toymodels import TinyConfig, make_batches, make_model, train

SMALL = TinyConfig(vocab=64, dim=32, layers=2, heads=4, hidden=64, seq=8, batch=2)


def _phase() -> str:
    node = getattr(torch._C, "_current_autograd_node", None)
    return "backward" if node is not None and node() is not None else "forward"


class PlantFault(TorchDispatchMode):
    """Scale (or NaN) the output of the ``call``-th ``op`` in ``phase``."""

    def __init__(self, op: str, phase: str, call: int, factor: float | str) -> None:
        super().__init__()
        self.op, self.phase, self.call, self.factor = op, phase, call, factor
        self.counts: dict[str, int] = {}
        self.fired = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if tool_is_busy() or str(func) != self.op:
            return out
        ph = _phase()
        n = self.counts.get(ph, 0)
        self.counts[ph] = n + 1
        if ph == self.phase and n == self.call:
            self.fired = True
            out = out * (float("nan") if self.factor == "nan" else float(self.factor))
        return out


def run_dump(path: Path, level: str, mode: str, fault: tuple[str, str, int, Any] | None = None,
             extra_clone_in: str | None = None) -> Path:
    """One training step of the small TinyLlama, dumped to ``path``."""
    model = make_model(0, SMALL)
    batches = make_batches(1, cfg=SMALL)
    handle = None
    if extra_clone_in is not None:  # an extra (exact) op on this side only
        handle = model.get_submodule(extra_clone_in).register_forward_hook(lambda m, i, o: o.clone())
    planted = PlantFault(*fault) if fault else None
    with planted if planted is not None else contextlib.nullcontext():
        with torchparity.dump(str(path), level=level, mode=mode, model=model, fsync=False):
            train(model, batches)
    if handle is not None:
        handle.remove()
    if planted is not None:
        assert planted.fired, f"the fault {fault} never fired"
    return path


@pytest.fixture(scope="session")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``dumps(level, mode, fault=None, extra_clone_in=None)`` -> dump path (cached per session)."""
    root = tmp_path_factory.mktemp("compare_dumps")
    cache: dict[Any, Path] = {}

    def get(level: str, mode: str, fault: tuple[str, str, int, Any] | None = None,
            extra_clone_in: str | None = None) -> Path:
        key = (level, mode, fault, extra_clone_in)
        if key not in cache:
            cache[key] = run_dump(root / f"d{len(cache)}", level, mode, fault, extra_clone_in)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def small_config() -> TinyConfig:
    """The TinyLlama configuration every compare test dumps."""
    return SMALL


@pytest.fixture()
def zoo(monkeypatch: pytest.MonkeyPatch):
    """``tests/zoo/zoo_cells`` (its models in ``zoo.ZOO``), imported with one torch thread as the
    zoo runner uses; removed from ``sys.modules`` afterwards."""
    import sys
    from pathlib import Path

    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "zoo"))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    import zoo_cells

    yield zoo_cells
    torch.set_num_threads(before)
    sys.modules.pop("zoo_cells", None)
    sys.modules.pop("zoo_models", None)
