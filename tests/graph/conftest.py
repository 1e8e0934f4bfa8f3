"""Graph test fixtures: dumps made once per session, by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

_spec = importlib.util.spec_from_file_location("graph_helpers", Path(__file__).with_name("helpers.py"))
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


@pytest.fixture(scope="session")
def graph_dump(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``graph_dump(name, **kwargs)``: the dump ``helpers._dump`` writes, made on first use."""
    root = tmp_path_factory.mktemp("graph_dumps")
    made: dict[str, Path] = {}

    def get(name: str, **kwargs: Any) -> Path:
        if name not in made:
            made[name] = helpers._dump(root / name, **kwargs)
        return made[name]

    return get
