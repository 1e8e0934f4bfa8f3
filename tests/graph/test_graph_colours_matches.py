"""Graph: graded colours (precision index, bands, legend), manual matching (page + match file),
untrusted names in the page, option validation and mismatched inputs (issue 13, item 5)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from torchparity.errors import UsageError
from torchparity.graph import build_graph, compare_graphs, render_html, write_html
from torchparity.graph.colours import DEFAULT_BANDS, band_of, check_bands, legend, precision_index
from torchparity.graph.matches import load_matches

_spec = importlib.util.spec_from_file_location("graph_helpers", Path(__file__).with_name("helpers.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
_run, FAULT_MODULE = _helpers.run_cli, _helpers.FAULT_MODULE
SMOKE = Path(__file__).with_name("page_smoke.js")


@pytest.fixture(scope="module")
def dumps(graph_dump: Callable[..., Path]) -> dict[str, Path]:
    return {"bench": graph_dump("bench"), "dev": graph_dump("dev", fault=True),
            "clone": graph_dump("clone", extra_clone_in="layers.0.mlp"),
            "mul": graph_dump("mul", extra_clone_in="layers.0.mlp", extra_op="mul")}


def _smoke(page: Path, *args: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    p = subprocess.run([node, str(SMOKE), str(page), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- precision index and bands -------------------------------------------------------------

def test_precision_index_rules() -> None:
    out = {"io": "output", "match": "exact"}
    # statistics: compare's error estimate of the outputs, capped at 1; inputs do not count
    assert precision_index([{**out, "error": 0.3}, {"io": "input", "error": 0.9}], "statistics") == 0.3
    assert precision_index([{**out, "error": 7.0}], "statistics") == 1.0
    assert precision_index([{**out, "error": "Infinity"}], "statistics") == 1.0
    # no error column: the largest relative statistic difference (msprobe's definition)
    assert precision_index([{**out, "max_rel_diff": 0.1, "norm_rel_diff": -0.45}], "statistics") == 0.45
    # tensor mode: the drop of the 1 per mille ratio from inputs to outputs
    rows = [{"io": "input", "one_thousandth_ratio": 0.98}, {**out, "one_thousandth_ratio": 0.58}]
    assert precision_index(rows, "tensor") == pytest.approx(0.40)
    assert precision_index([{**out, "one_thousandth_ratio": 0.99}, {"io": "input", "one_thousandth_ratio": 0.5}],
                           "tensor") == 0.0
    # md5: any differing output checksum is the deepest colour
    assert precision_index([{**out, "md5_equal": True}, {**out, "md5_equal": False}], "md5") == 1.0
    assert precision_index([{**out, "md5_equal": True}], "md5") == 0.0
    # more NaN/Inf on the device than on the bench: deepest, whatever the error says
    assert precision_index([{**out, "error": 0.0, "device_nan": 3}], "statistics") == 1.0
    # the same -inf on both sides (an attention mask) is not a finding
    assert precision_index([{**out, "error": 0.0, "device_inf": 4, "bench_inf": 4}], "statistics") == 0.0
    # nothing compared: no index (white), unmatched output rows do not count
    assert precision_index([{"io": "input", "error": 0.5}], "statistics") is None
    assert precision_index([{**out, "match": "unmatched", "error": 0.5}], "statistics") is None


def test_bands_and_legend() -> None:
    assert [band_of(x) for x in (0.0, 0.19, 0.2, 0.5, 0.8, 1.0, None, math.nan)] == [0, 0, 1, 2, 4, 4, None, None]
    leg = legend()
    assert [(b.low, b.high) for b in leg] == [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.0)]
    assert len({b.colour for b in leg}) == 5
    two = legend((0.01, 0.1))
    assert [(b.low, b.high) for b in two] == [(0.0, 0.01), (0.01, 0.1), (0.1, 1.0)]
    assert two[-1].colour == leg[-1].colour  # the deepest colour is always the last band's
    assert band_of(0.05, (0.01, 0.1)) == 1
    assert check_bands(None) == DEFAULT_BANDS
    for bad in ([], [0.5, 0.3], [0.0], [1.0], ["nan"], ["x"], [0.1, 0.2, 0.3, 0.4, 0.5], [float("inf")]):
        with pytest.raises(ValueError):
            check_bands(bad)


def test_compare_grades_nodes_by_error_size(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = compare_graphs(dumps["dev"], dumps["bench"])
    rc = g.nodes[g.root_cause]
    assert rc.precision_index == pytest.approx(0.5, abs=1e-3) and rc.band == 2  # x1.5: 50 % error
    path = set(g.path_to(g.root_cause))
    for nid in path:  # the worst index below a module is its colour
        assert g.nodes[nid].band == 2 and g.nodes[nid].worst_index == pytest.approx(rc.precision_index)
    compared = [n for n in g.nodes.values() if n.id not in path and n.worst_index is not None]
    assert len(compared) > 100 and all(n.band == 0 for n in compared)
    # graded, not one colour per verdict: error nodes of different size get different bands
    finer = compare_graphs(dumps["dev"], dumps["bench"], bands=(1e-6, 0.01, 0.3))
    assert finer.nodes[finer.root_cause].band == 3
    assert len({n.band for n in finer.nodes.values() if n.band is not None}) >= 3
    data = g.to_dict()
    assert [b["colour"] for b in data["legend"]] == [b.colour for b in legend()]
    with pytest.raises(UsageError, match="colour bands"):
        compare_graphs(dumps["dev"], dumps["bench"], bands=(0.5, 0.2))
    # the page paints each row with its band's legend colour and shows the legend
    write_html(g, tmp_path / "g.html")
    res = _smoke(tmp_path / "g.html")
    colours = {b["colour"] for b in data["legend"]}
    assert res["bands"] and all(c in colours for _, c in res["bands"])
    assert ("2", data["legend"][2]["colour"]) in {tuple(x) for x in res["bands"]}
    assert ("0", data["legend"][0]["colour"]) in {tuple(x) for x in res["bands"]}
    assert "0.4–<0.6" in res["legend"] and "0.8–1" in res["legend"] and "unmatched" in res["legend"]


# ---- manual matching -----------------------------------------------------------------------

def test_manual_match_in_page_and_back_through_the_cli(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = compare_graphs(dumps["clone"], dumps["mul"])
    dev = [n for n in g.nodes.values() if n.side == "device"]
    ben = [n for n in g.nodes.values() if n.side == "bench"]
    assert len(dev) == 1 and len(ben) == 1 and "clone" in dev[0].op and "mul" in ben[0].op
    unmatched = g.nodes[g.root].n_unmatched
    write_html(g, tmp_path / "g.html")
    res = _smoke(tmp_path / "g.html", "match", dev[0].id, ben[0].id)
    assert res["can_match"] and dev[0].name in res["picked"] and ben[0].name in res["picked"]
    node = res["node"]
    assert node["manual"] and node["side"] == "both" and node["bench_name"] == ben[0].name
    assert node["verdict"] == "none"  # shown, never judged a pass
    assert node["precision_index"] == 0  # clone and *1.0 give the same statistics
    assert any(m["match"] == "manual" and m["io"] == "output" for m in node["metrics"])
    assert res["bench_gone"] and res["root_unmatched"] == unmatched - 2
    exported = json.loads(res["exported"])
    assert exported["format"] == "torchparity-matches" and exported["records"] == {dev[0].name: ben[0].name}

    # the exported file goes back in: the CLI applies it
    mf = tmp_path / "matches.json"
    mf.write_text(res["exported"], encoding="utf-8")
    code, out = _run(["graph", str(dumps["clone"]), str(dumps["mul"]), "-o", str(tmp_path / "o"),
                      "--match-file", str(mf)])
    assert code == 0 and "manual matches applied: 1" in out, out
    data = json.loads((tmp_path / "o" / "graph.json").read_text())
    n = data["nodes"][dev[0].id]
    assert n["manual"] and n["side"] == "both" and n["bench_name"] == ben[0].name and n["verdict"] == "none"
    assert ben[0].id not in data["nodes"]
    assert n["precision_index"] == pytest.approx(node["precision_index"], abs=1e-12)
    assert data["nodes"][data["root"]]["n_unmatched"] == unmatched - 2
    assert data["matches"]["records"] == {dev[0].name: ben[0].name}
    assert data["summary"]["n_pass"] == compare_graphs(dumps["clone"], dumps["mul"]).summary["n_pass"]


def test_manual_match_statistics_agree_between_page_and_python(dumps: dict[str, Path], tmp_path: Path) -> None:
    """Two records with different statistics: the page's index equals compare's stat metrics'."""
    g = compare_graphs(dumps["clone"], dumps["mul"])
    dev = next(n for n in g.nodes.values() if n.side == "device")
    ben = next(n for n in g.nodes.values() if n.side == "bench")
    ben.tensors = [{**t, "max": t["max"] * 1.3, "norm": t["norm"] * 1.1} if t.get("io") == "output" else t
                   for t in ben.tensors]
    write_html(g, tmp_path / "g.html")
    node = _smoke(tmp_path / "g.html", "match", dev.id, ben.id)["node"]
    from torchparity.graph.matches import manual_metrics

    py = precision_index(manual_metrics(dev.tensors, ben.tensors), "statistics")
    assert py is not None and py > 0.05
    assert node["precision_index"] == pytest.approx(py, rel=1e-9)


def test_match_file_errors(tmp_path: Path) -> None:
    cases = {"notjson.json": b"{nope", "binary.json": b"\xff\xfe\x00\x01", "list.json": b"[1, 2]",
             "types.json": b'{"records": {"a": 5}}', "fmt.json": b'{"format": "other", "records": {}}',
             "mods.json": b'{"modules": ["x"]}'}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UsageError) as ei:
            load_matches(tmp_path / name)
        msg = str(ei.value)
        assert name in msg and "\n" not in msg and "graph.html" in msg, msg
    with pytest.raises(UsageError, match="does not exist"):
        load_matches(tmp_path / "missing.json")
    m = load_matches({"modules": {"a.b": "a.c"}, "records": None})
    assert m.modules == {"a.b": "a.c"} and m.records == {}


def test_unknown_match_is_a_warning_not_a_pass(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = compare_graphs(dumps["clone"], dumps["mul"], matches={"records": {"Nope.0.forward": "Nada.1.forward"}})
    assert any("Nope.0.forward" in w and "ignored" in w for w in g.warnings)
    assert g.summary["manual_matches"] == 0 and sum(n.manual for n in g.nodes.values()) == 0


# ---- untrusted names -----------------------------------------------------------------------

EVIL = ["</script><script>alert(1)</script>", "<script>alert(2)</script>", "a\"b'c", "x&amp;y<&>",
        "../../etc/passwd", "nul\x00byte", "<!--", "\u2028line"]


def test_untrusted_names_reach_the_page_as_text(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = compare_graphs(dumps["dev"], dumps["bench"])
    mods = [n for n in g.nodes.values() if n.kind == "module" and n.module][:len(EVIL)]
    ops = [n for n in g.nodes.values() if n.kind == "op"][:len(EVIL)]
    for i, evil in enumerate(EVIL):
        mods[i].name = mods[i].module_class = evil
        ops[i].name, ops[i].op, ops[i].reason = evil, evil, evil
        ops[i].stack = [evil]
    g.device_dump = EVIL[0]
    g.warnings.append(EVIL[1])
    g.matches = {"records": {EVIL[0]: EVIL[1]}, "modules": {}}
    page = render_html(g)
    # exactly the page's own two script elements; no raw markup from names anywhere
    assert page.count("<script") == 2 and page.count("</script>") == 2
    for evil in EVIL:
        assert evil not in page or evil in ("a\"b'c", "../../etc/passwd"), evil
    assert "<!--" not in page and "\x00" not in page and "\u2028" not in page
    data = json.loads(page.split('id="graph-data">', 1)[1].split("</script>", 1)[0])
    names = {n["name"] for n in data["nodes"].values()}
    assert set(EVIL) <= names  # every name survives byte for byte in the embedded JSON
    assert data["device_dump"] == EVIL[0] and data["matches"]["records"] == {EVIL[0]: EVIL[1]}
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
    # the script renders them (as textContent) without failing
    write_html(g, tmp_path / "evil.html")
    res = _smoke(tmp_path / "evil.html")
    assert res["all"] > 10


# ---- CLI validation ------------------------------------------------------------------------

def test_cli_options_validated(dumps: dict[str, Path], tmp_path: Path) -> None:
    dev, bench = str(dumps["dev"]), str(dumps["bench"])
    afile = tmp_path / "afile"
    afile.write_text("x")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bin")
    cases = [
        (["graph", dev, bench, "-o", str(afile / "sub")], "output directory"),
        (["graph", dev, bench, "-o", "/proc/torchparity-x"], "output directory"),
        (["graph", str(afile), bench, "-o", str(tmp_path / "o")], "is a file"),
        (["graph", dev, str(tmp_path / "nosuch"), "-o", str(tmp_path / "o")], "does not exist"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--mapping", str(binary)], "not a UTF-8 text file"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--mapping", str(tmp_path / "nomap.yaml")], "does not exist"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--bands", "0.5,0.2"], "--bands"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--bands", "nan"], "--bands"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--bands", "0,1"], "--bands"),
        (["graph", dev, bench, "-o", str(tmp_path / "o"), "--match-file", str(binary)], "match file"),
        (["graph", dev, "-o", str(tmp_path / "o"), "--match-file", str(binary)], "two dumps"),
        (["graph", dev, "-o", str(tmp_path / "o"), "--bands", "0.5"], "two dumps"),
    ]
    for args, needle in cases:
        code, msg = _run(args)
        assert code == 2 and needle in msg and "\n" not in msg.strip(), (args, msg)
    assert not (tmp_path / "o").exists()  # bad input: nothing created
    for bad in (["--step", "-1"], ["--rank", "-2"]):
        code, _ = _run(["graph", dev, bench, "-o", str(tmp_path / "o"), *bad])
        assert code == 2
    code, msg = _run(["graph", dev, bench, "-o", str(afile)])
    assert code == 2


def test_cli_unwritable_output_one_line_subprocess(dumps: dict[str, Path], tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    p = subprocess.run([sys.executable, "-m", "torchparity", "graph", str(dumps["bench"]), "-o", str(afile / "o")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "writable -o DIR" in p.stderr


# ---- mismatched inputs ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def aten_dumps(graph_dump: Callable[..., Path]) -> dict[str, Path]:
    return {"aten": graph_dump("aten", level="aten"), "bf16": graph_dump("bf16", level="aten", dtype="bfloat16")}


def test_mismatched_inputs_never_traceback(dumps: dict[str, Path], aten_dumps: dict[str, Path], tmp_path: Path) -> None:
    mapping = tmp_path / "map.yaml"
    mapping.write_text("down_proj: down_projX\n")
    for i, (d, b, extra) in enumerate([(dumps["dev"], dumps["bench"], ["--mapping", str(mapping)]),
                                       (dumps["bench"], aten_dumps["aten"], []),
                                       (aten_dumps["bf16"], aten_dumps["aten"], []),
                                       (aten_dumps["bf16"], dumps["bench"], [])]):
        out = tmp_path / f"o{i}"
        p = subprocess.run([sys.executable, "-m", "torchparity", "graph", str(d), str(b), "-o", str(out), *extra],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
        data = json.loads((out / "graph.json").read_text())
        assert data["mode"] == "compare" and data["legend"]


def test_renamed_module_keeps_both_sides(dumps: dict[str, Path]) -> None:
    """A mapping that renames a module to one the bench lacks: the bench's module of the old name
    is bench-only and must not overwrite the device module of that name."""
    g = compare_graphs(dumps["dev"], dumps["bench"], layer_mapping={"down_proj": "down_projX"})
    dev_mod = g.node(FAULT_MODULE)
    assert dev_mod.side == "device" and dev_mod.calls and all("record_id" in c for c in dev_mod.calls)
    bench_mod = g.nodes[f"BM:{FAULT_MODULE}"]
    assert bench_mod.side == "bench" and bench_mod.status == "unmatched" and bench_mod.parent == "M:layers.1.mlp"
    assert dev_mod.calls is not bench_mod.calls


def test_build_mode_has_verdict_colours_only(dumps: dict[str, Path], tmp_path: Path) -> None:
    g = build_graph(dumps["bench"])
    assert all(n.band is None and n.precision_index is None for n in g.nodes.values())
    write_html(g, tmp_path / "b.html")
    res = _smoke(tmp_path / "b.html")
    assert res["bands"] == [] and "not judged" in res["legend"]
