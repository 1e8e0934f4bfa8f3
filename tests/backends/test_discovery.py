"""Discovery: the offline `torchparity plugins`, out-of-tree (third-party) backends, a broken
plugin, plugins.yaml disable/options, PrivateUse1 safety and import hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchparity.config import parse_config
from torchparity.plugins import build_registry

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
VENDOR_BACKENDS = ("cuda", "musa", "npu", "maca")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHPARITY_PLUGINS", "PYTHONPATH")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", **extra)
    return env


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, cwd=kw.pop("cwd", ROOT),
                          env=kw.pop("env", _env()), **kw)


# ---------------------------------------------------------------------------------------- offline CLI
def test_plugins_cli_lists_vendor_backends_unavailable_with_reasons():
    p = _run(["-m", "torchparity", "plugins", "--json"])
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)["plugins"] if r["kind"] == "backend"}
    import torch

    for name in VENDOR_BACKENDS:
        assert name in rows, f"backend {name} not discovered: {sorted(rows)}"
        if name == "cuda" and torch.cuda.is_available():
            continue  # a real GPU machine: cuda is legitimately available
        assert rows[name]["available"] == "no", rows[name]
        assert rows[name]["detail"] and "\n" not in rows[name]["detail"]
        assert "Traceback" not in rows[name]["detail"]
    assert "Traceback" not in p.stderr


def test_plugins_cli_table_exits_zero():
    p = _run(["-m", "torchparity", "plugins"])
    assert p.returncode == 0 and "npu" in p.stdout and "Traceback" not in p.stderr


def test_plugin_modules_import_neither_torch_nor_vendor_sdks():
    code = (
        "import sys\n"
        "import torchparity_backend_cuda, torchparity_backend_maca, torchparity_backend_musa, torchparity_backend_npu\n"
        "import torchparity_checker_overflow\n"
        "bad = [m for m in ('torch', 'torch_npu', 'torch_musa', 'torch_maca', 'pandas') if m in sys.modules]\n"
        "print(bad)\n"
    )
    p = _run(["-c", code])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_probing_never_renames_privateuse1_and_refuses_a_taken_one():
    """PrivateUse1 can be renamed once per process, so this runs in a subprocess."""
    code = (
        "import torch\n"
        "from torchparity_backend_npu import NpuBackend\n"
        "from torchparity_backend_musa import MusaBackend\n"
        "NpuBackend().is_available(); MusaBackend().is_available()\n"
        "print(torch._C._get_privateuse1_backend_name())\n"
        "torch.utils.rename_privateuse1_backend('musa')  # what torch_musa does on import\n"
        "print(NpuBackend().is_available().reason)\n"
    )
    p = _run(["-c", code])
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.strip().splitlines()[-2:]
    assert first == "privateuseone"
    assert "torch_npu" in second or "PrivateUse1 is already 'musa'" in second


# ---------------------------------------------------------------------------------------- third party
def test_third_party_backend_is_discovered():
    reg = build_registry(parse_config({}))
    assert "foo" in {c.name for c in reg.components if c.kind == "backend"}
    info = next(c for c in reg.components if c.name == "foo")
    assert info.dist == "torchparity-backend-foo" and info.version == "0.1"
    a = reg.backend("foo").is_available()
    assert not a and "torch_foo" in a.reason


def test_third_party_backend_available_with_fake_sdk(monkeypatch):
    import importlib.machinery
    import types

    import torch

    fake = types.ModuleType("torch_foo")
    fake.__spec__ = importlib.machinery.ModuleSpec("torch_foo", None)
    dev = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None, manual_seed_all=lambda s: None)
    monkeypatch.setitem(sys.modules, "torch_foo", fake)
    monkeypatch.setattr(torch, "foo", dev, raising=False)
    reg = build_registry(parse_config({}))
    assert reg.backend("foo").is_available()
    assert reg.backend("foo").environment()["backend"] == "foo"


def test_broken_plugin_is_reported_and_the_rest_works(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES / "site_broken"))
    reg = build_registry(parse_config({}))
    broken = [p for p in reg.plugins if p.name == "torchparity_backend_broken"]
    assert broken and broken[0].status == "import-failed" and "libfoo_runtime" in broken[0].detail
    assert any("torchparity_backend_broken" in p and "plugins.disable" in p for p in reg.problems)
    names = {c.name for c in reg.components if c.kind == "backend"}
    assert {"cpu", "foo", "npu", "musa", "cuda", "maca"} <= names


def test_plugins_yaml_disable_removes_third_party_backend():
    reg = build_registry(parse_config({"plugins": {"disable": ["torchparity_backend_foo"]}}))
    assert "foo" not in {c.name for c in reg.components}
    assert any(p.name == "torchparity_backend_foo" and p.status == "disabled" for p in reg.plugins)
    reg2 = build_registry(parse_config({"plugins": {"disable": ["foo"]}}))  # by component name
    with pytest.raises(Exception, match="disabled"):
        reg2.backend("foo")


def test_plugins_yaml_options_reach_the_component():
    reg = build_registry(parse_config({"backends": {"options": {"foo": {"precision": "medium"},
                                                                "npu": {"upcast": {"float64": "float32"}},
                                                                "cuda": {"allow_tf32": False}}}}))
    assert reg.backend("foo").options.precision == "medium"
    assert reg.backend("npu").upcast_dtypes == {"float64": "float32"}
    assert reg.backend("cuda").options.allow_tf32 is False
    assert not reg.problems or all("broken" in p for p in reg.problems)


def test_unknown_option_is_a_clear_problem():
    reg = build_registry(parse_config({"backends": {"options": {"foo": {"precison": "high"}}}}))
    msg = [p for p in reg.problems if "foo" in p]
    assert msg and "unknown option(s) precison" in msg[0] and "known options: precision" in msg[0]
    with pytest.raises(Exception, match="bad options"):
        reg.backend("foo")


def test_fake_dist_is_invisible_to_ci_plugin_check():
    """.ci/check_plugins.py runs outside pytest, without tests/fixtures/site on sys.path."""
    p = _run([str(ROOT / ".ci" / "check_plugins.py")])
    assert "torchparity_backend_foo" not in p.stdout and "broken" not in p.stdout
    for name in ("torchparity_backend_cuda", "torchparity_backend_npu", "torchparity_backend_musa",
                 "torchparity_backend_maca", "torchparity_checker_overflow"):
        assert f"loaded         {name}" in p.stdout, p.stdout


def test_fixture_package_matches_installed_copy():
    src = (FIXTURES / "thirdparty_backend" / "torchparity_backend_foo" / "__init__.py").read_text()
    assert src == (FIXTURES / "site" / "torchparity_backend_foo" / "__init__.py").read_text()
    eps = (FIXTURES / "site" / "torchparity_backend_foo-0.1.dist-info" / "entry_points.txt").read_text()
    assert "torchparity_backend_foo = torchparity_backend_foo" in eps


# ---------------------------------------------------------------------------------------- unknown names
def _unknown(reg, what: str) -> list[str]:
    return [p for p in reg.problems if what in p]


def test_unknown_disable_name_is_warned_once_with_the_known_names():
    reg = build_registry(parse_config({"plugins": {"disable": ["nosuch"]}}))
    msgs = _unknown(reg, "'nosuch'")
    assert len(msgs) == 1 and "plugins.disable" in msgs[0] and "\n" not in msgs[0]
    assert "cpu" in msgs[0] and "torchparity_backend_cpu" in msgs[0] and "fix the name" in msgs[0]
    assert {c.name for c in reg.components} >= {"cpu", "foo"}  # nothing else changed


def test_unknown_enable_name_is_warned():
    reg = build_registry(parse_config({"plugins": {"enable": ["cpu", "torchparity_backend_cpu", "nosuch2"]}}))
    assert len(_unknown(reg, "plugins.enable names 'nosuch2'")) == 1
    assert not _unknown(reg, "names 'cpu'")


@pytest.mark.parametrize("name", ["foo", "torchparity_backend_foo", "torchparity-backend-foo"])
def test_known_disable_names_are_not_warned(name):
    # component name, entry-point name and distribution name are all valid
    reg = build_registry(parse_config({"plugins": {"disable": [name]}}))
    assert not _unknown(reg, "plugins.disable"), reg.problems


def test_unknown_reference_and_target_backends_are_warned():
    reg = build_registry(parse_config({"backends": {"reference": "nosuchbackend", "target": "nosuchtarget"}}))
    ref = _unknown(reg, "backends.reference names backend 'nosuchbackend'")
    tgt = _unknown(reg, "backends.target names backend 'nosuchtarget'")
    assert len(ref) == 1 and len(tgt) == 1 and "installed backends: cpu" in ref[0]
    assert not _unknown(build_registry(parse_config({"backends": {"reference": "cpu"}})), "backends.reference")


def test_options_for_a_backend_that_is_not_installed_are_warned():
    reg = build_registry(parse_config({"backends": {"options": {"zzz": {"a": 1}, "cpu": {"fp64": True}}}}))
    msgs = _unknown(reg, "backends.options has options for backend")
    assert len(msgs) == 1 and "'zzz'" in msgs[0] and "not installed" in msgs[0]
    # a backend whose plugin is disabled is not "unknown": its options just wait
    reg = build_registry(parse_config({"plugins": {"disable": ["torchparity_backend_foo"]},
                                       "backends": {"options": {"foo": {"precision": "medium"}}}}))
    assert not _unknown(reg, "backends.options"), reg.problems


def test_unknown_names_reach_the_cli_as_warnings(tmp_path):
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("version: 1\nplugins:\n  disable: [nosuch]\nbackends:\n  reference: nosuchbackend\n")
    # this checkout's sources (the subprocess must not run another installed copy)
    env = _env(PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT / "core")))
    p = _run(["-m", "torchparity", "--plugins", str(cfg), "plugins", "--json", "--no-probe"], env=env)
    assert p.returncode == 0, p.stderr
    problems = json.loads(p.stdout)["problems"]
    assert any("plugins.disable names 'nosuch'" in m for m in problems)
    assert any("backends.reference names backend 'nosuchbackend'" in m for m in problems)
    assert "plugins.disable names 'nosuch'" in p.stderr  # and printed as a warning
