"""Worker processes started on their own (workers=None) only where the main module is safe to
import again in a spawned worker: torchparity's command line, an interactive session, or a file
whose top level has the ``if __name__ == "__main__":`` guard."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from torchparity import workers

GUARDED = "import torchparity\n\n\ndef main():\n    pass\n\n\nif __name__ == '__main__':\n    main()\n"
UNGUARDED = "import torchparity\n\ntorchparity.compare('a', 'b')\n"


@pytest.mark.parametrize("main_file, source, allowed", [
    (None, None, True),  # python -c, a REPL, a notebook
    ("torchparity", None, True),  # the console script
    ("torchparity/__main__.py", None, True),  # python -m torchparity
    ("train.py", GUARDED, True),
    ("train.py", UNGUARDED, False),  # a worker would run the compare again
    ("gone.py", None, False),  # unreadable: not taken for safe
])
def test_automatic_workers_only_under_a_safe_main_module(tmp_path, monkeypatch, main_file, source, allowed) -> None:
    main = types.ModuleType("__main__")
    if main_file is not None:
        f = tmp_path / main_file
        f.parent.mkdir(parents=True, exist_ok=True)
        if source is not None:
            f.write_text(source)
        main.__file__ = str(f)
    monkeypatch.setitem(sys.modules, "__main__", main)
    workers._guarded.cache_clear()
    assert workers.automatic_workers_allowed() is allowed


def test_a_script_without_the_guard_gets_one_process(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from torchparity.workers import automatic_workers_allowed\n"
                      "print(automatic_workers_allowed())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
