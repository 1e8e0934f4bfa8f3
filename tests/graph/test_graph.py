"""Graph: hierarchy from a TinyLlama mix dump, node-by-node compare with a planted fault,
structure differences, the self-contained HTML and the CLI's exit codes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Callable

import pytest

from torchparity.graph import build_graph, compare_graphs, render_html, write_html
from torchparity.toymodels import make_model

_spec = importlib.util.spec_from_file_location("graph_helpers", Path(__file__).with_name("helpers.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
SMALL, run_cli = _helpers.SMALL, _helpers.run_cli

FAULT_MODULE = "layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def dumps(graph_dump: Callable[..., Path]) -> dict[str, Path]:
    return {"bench": graph_dump("bench"), "dev": graph_dump("dev", fault=True),
            "extra": graph_dump("clone", extra_clone_in="layers.0.mlp"), "nan": graph_dump("nan", fault="nan")}


def test_single_dump_overflow_marks(dumps: dict[str, Path]) -> None:
    g = build_graph(dumps["nan"])
    crit = [n for n in g.nodes.values() if n.kind == "op" and n.overflow == "critical"]
    assert crit and crit[0].module == FAULT_MODULE and min(crit, key=lambda n: n.order).phase == "forward"
    assert g.node(FAULT_MODULE).status == "overflow" and g.nodes[g.root].n_overflow > 0
    assert g.node("embed_tokens").overflow is None


def test_hierarchy_matches_the_model(dumps: dict[str, Path]) -> None:
    g = build_graph(dumps["bench"])
    model = make_model(0, SMALL)
    mods = {n.module for n in g.nodes.values() if n.kind == "module"}
    assert mods == {name for name, _ in model.named_modules()}
    assert g.node("layers.0.mlp").parent == "M:layers.0"
    assert g.node("layers.1.self_attn.q_proj").parent == "M:layers.1.self_attn"
    assert g.node("layers.0.mlp").module_class == "MLP"
    # ops hang under the module they ran in, forward and backward
    down = g.node(FAULT_MODULE)
    kids = [g.nodes[c] for c in down.children]
    assert {k.phase for k in kids} == {"forward", "backward"}
    assert all(k.kind == "op" and k.module == FAULT_MODULE for k in kids)
    assert any(k.op == "torch.nn.functional.linear" and k.phase == "forward" for k in kids)
    silu = [g.nodes[c] for c in g.node("layers.0.mlp").children if g.nodes[c].op == "torch.nn.functional.silu"]
    assert silu and silu[0].tensors and silu[0].tensors[0]["dtype"] == "float32"
    # module records become the module's calls
    assert {c["phase"] for c in g.node("layers.0.mlp").calls} >= {"forward", "backward"}
    assert g.mode == "build" and all(n.status in ("none",) for n in g.nodes.values())


def test_compare_colours_the_root_cause_path(dumps: dict[str, Path]) -> None:
    g = compare_graphs(dumps["dev"], dumps["bench"])
    assert g.root_cause is not None
    rc = g.nodes[g.root_cause]
    assert rc.module == FAULT_MODULE and rc.phase == "forward" and rc.root_cause
    path = g.path_to(g.root_cause)
    assert path[0] == g.root and "M:layers.1.mlp" in path and "M:layers.1" in path
    for nid in path:
        assert g.nodes[nid].status == "error", nid
        assert g.nodes[nid].on_root_path
    off_path = [n for n in g.nodes.values() if n.id not in path]
    assert not [n.id for n in off_path if n.status == "error" and n.kind == "module"]
    assert g.node("layers.0").status in ("pass", "warning")
    assert g.node("layers.1.self_attn").status in ("pass", "warning")
    assert rc.amplification is not None and rc.amplification > 10
    assert rc.worst_error is not None and rc.worst_error > 0.1
    assert not [n for n in g.nodes.values() if n.side != "both"]
    assert rc.bench_name == rc.name and rc.bench_tensors and rc.metrics


def test_extra_op_is_unmatched(dumps: dict[str, Path]) -> None:
    g = compare_graphs(dumps["extra"], dumps["bench"])
    extra = [n for n in g.nodes.values() if n.side == "device"]
    assert extra and all(n.kind == "op" for n in extra)
    assert any("clone" in (n.op or "") for n in extra)
    assert all(n.status == "unmatched" for n in extra)
    # code in a module's forward hook belongs to the hooked module (issue 14; was the parent block)
    assert {n.parent for n in extra} == {"M:layers.0.mlp"}
    assert g.node("layers.0").n_unmatched == len(extra) and g.node("layers.1").n_unmatched == 0
    assert g.node("layers.0").status != "unmatched"  # the module itself exists on both sides
    assert g.nodes[g.root].n_unmatched == len(extra)
    # the other way round, the op is bench-only
    g2 = compare_graphs(dumps["bench"], dumps["extra"])
    bench_only = [n for n in g2.nodes.values() if n.side == "bench"]
    assert bench_only and all(n.id.startswith("B:") for n in bench_only)


def test_html_is_self_contained_and_escaped(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = build_graph(dumps["bench"])
    evil = "</script><script>alert(1)</script>"
    g.node("layers.0.mlp").name = evil
    g.node("layers.0.mlp").module_class = "<img src=x onerror=alert(2)>"
    page = render_html(g)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert evil not in page and "<img" not in page
    data = page.split('id="graph-data">', 1)[1].split("</script>", 1)[0]
    parsed = json.loads(data)
    assert parsed["nodes"]["M:layers.0.mlp"]["name"] == evil
    assert "M:layers.1.mlp.down_proj" in parsed["nodes"]
    assert "innerHTML" not in page  # names are set with textContent only
    write_html(g, tmp_path / "g.html")
    assert (tmp_path / "g.html").read_text(encoding="utf-8") == page


_run = run_cli


def test_cli_compare_build_and_json(dumps: dict[str, Path], tmp_path: Path) -> None:
    code, out = _run(["graph", str(dumps["dev"]), str(dumps["bench"]), "-o", str(tmp_path / "c")])
    assert code == 1, out
    assert "root cause" in out and FAULT_MODULE in out
    data = json.loads((tmp_path / "c" / "graph.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["mode"] == "compare" and data["nodes"][data["root_cause"]]["root_cause"]
    assert (tmp_path / "c" / "graph.html").is_file()
    code, out = _run(["graph", str(dumps["bench"]), str(dumps["bench"]), "-o", str(tmp_path / "same")])
    assert code == 0, out
    code, out = _run(["graph", str(dumps["bench"]), "-o", str(tmp_path / "b")])
    assert code == 0 and "29 modules" in out, out
    assert json.loads((tmp_path / "b" / "graph.json").read_text())["mode"] == "build"


def test_cli_bad_input(dumps: dict[str, Path], tmp_path: Path) -> None:
    code, msg = _run(["graph", str(tmp_path / "missing"), "-o", str(tmp_path / "o")])
    assert code == 2 and "does not exist" in msg
    code, msg = _run(["graph", str(dumps["bench"]), "-o", str(tmp_path / "o"), "--step", "7"])
    assert code == 2 and "step 7" in msg
    code, msg = _run(["graph", str(dumps["bench"]), "-o", str(tmp_path / "o"), "--mapping", "x.yaml"])
    assert code == 2 and "two dumps" in msg


def test_cli_bad_input_subprocess_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "torchparity", "graph", str(tmp_path / "nope"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_page_script_runs(dumps: dict[str, Path], tmp_path: Path) -> None:
    """The page's script runs on a minimal DOM stub: it renders the tree, a filter shrinks it."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    write_html(compare_graphs(dumps["dev"], dumps["bench"]), tmp_path / "g.html")
    p = subprocess.run([node, str(Path(__file__).with_name("page_smoke.js")), str(tmp_path / "g.html")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert 0 < counts["err"] < counts["all"] and counts["details"] > 10
