"""The last false passes of the 10,000-case fuzz run (bench/results/fuzz.md), replayed as unit tests.

Each test applies the exact mutation of one seed to a small real dump and checks that the compare
against the clean copy does not say "the runs agree": the record is refused as damage, shown as
unmatched, or shown as not compared.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

import torchparity
from torchparity.dump.reader import damage, open_dump, read_unit

RANK = Path("step0") / "rank0"


def _real_dump(root: Path, mode: str) -> Path:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))
    with torchparity.dump(str(root), level="aten", mode=mode, model=model, stack=True, summaries="step"):
        model(torch.randn(3, 4)).sum().backward()
    return root


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("replay")
    return {"statistics": _real_dump(d / "stats", "statistics"), "tensor": _real_dump(d / "tensor", "tensor")}


def _edit_record(clean: Path, out: Path, line: int | str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Copy ``clean`` to ``out`` and edit one record of records.jsonl: by 1-based line, or by name."""
    shutil.copytree(clean, out)
    f = out / RANK / "records.jsonl"
    lines = f.read_text().splitlines()
    if isinstance(line, str):
        line = next(k for k, x in enumerate(lines, 1) if json.loads(x)["name"] == line)
    rec = json.loads(lines[line - 1])
    edit(rec)
    lines[line - 1] = json.dumps(rec)
    f.write_text("\n".join(lines) + "\n")
    return out


def _reader_damage(dump: Path) -> list[str]:
    warnings: list[str] = []
    for u in open_dump(dump).units:
        read_unit(u, warnings, compact=True)
    return damage(warnings)


def _not_agree(mutated: Path, clean: Path) -> str:
    """How the compare refuses to call the mutated dump agreeing ("refused", "unmatched", ...)."""
    if _reader_damage(mutated):
        with pytest.raises(torchparity.errors.TorchparityError):
            torchparity.compare(mutated, clean)
        return "refused"
    res = torchparity.compare(mutated, clean)
    s = res.summary
    if res.diverged:
        return "divergence"
    if s.get("n_unmatched_device", 0) + s.get("n_unmatched_bench", 0):
        return "unmatched"
    if s.get("n_not_compared", 0):
        return "not-compared"
    raise AssertionError(f"compare says the runs agree: {s}")


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_seed_2229_unknown_level_is_damage(dumps: dict[str, Path], tmp_path: Path, mode: str) -> None:
    """``"level": "../x"``: no writer writes that level; the reader reports the record as damage."""
    bad = _edit_record(dumps[mode], tmp_path / "m", 5, lambda r: r.update(level="../x"))
    lost = _reader_damage(bad)
    assert lost and "records.jsonl" in lost[0] and "level" in lost[0] and "line 5" in lost[0]
    assert _not_agree(bad, dumps[mode]) == "refused"


def test_seed_861_empty_name_is_damage(dumps: dict[str, Path], tmp_path: Path) -> None:
    bad = _edit_record(dumps["statistics"], tmp_path / "m", 2, lambda r: r.update(name=""))
    lost = _reader_damage(bad)
    assert lost and "name is empty" in lost[0] and "line 2" in lost[0]


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_seed_2450_record_moved_to_another_existing_module_does_not_pair(dumps: dict[str, Path], tmp_path: Path,
                                                                         mode: str) -> None:
    """``"module": "1.5"`` on one record of module "2": the alignment stage paired it across modules
    (as if "2" had been renamed "1.5", though "2" is still there) and the compare said "agree"."""
    bad = _edit_record(dumps[mode], tmp_path / "m", "Aten.t.1.forward", lambda r: r.update(module="1.5"))
    assert not _reader_damage(bad)  # a valid module path: only the matcher can tell
    assert _not_agree(bad, dumps[mode]) == "unmatched"
    res = torchparity.compare(bad, dumps[mode])
    moved = res.rows[res.rows["match"] == "unmatched"]
    assert set(moved["device_name"].dropna()) == {"Aten.t.1.forward"}


def test_seed_1367_op_flipped_to_no_op_name_is_damage(dumps: dict[str, Path], tmp_path: Path) -> None:
    """A flipped byte turned ``aten.gelu.default`` into ``aten.g?lu.default``; the 'shape' stage (fused
    ops) paired it with the bench gelu. No writer writes such an op name: damage."""
    bad = _edit_record(dumps["tensor"], tmp_path / "m", "Aten.gelu.0.forward", lambda r: r.update(op=r["op"].replace("gelu", "g?lu")))
    lost = _reader_damage(bad)
    assert lost and "op has a bad value" in lost[0]
    assert _not_agree(bad, dumps["tensor"]) == "refused"


def _msprobe(root: Path) -> Path:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tp_fuzz_engine_r", Path(__file__).with_name("test_fuzz_readers.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["tp_fuzz_engine_r"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.make_msprobe_dump(root)


@pytest.fixture(scope="module")
def ms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _msprobe(tmp_path_factory.mktemp("ms") / "ms")


@pytest.mark.parametrize("entry", ["Functional.linear.0.forward", "Module.layers.0.mlp.MLP.forward.0"])
def test_seeds_1715_1064_msprobe_null_argument_against_a_tensor_is_not_agreement(ms: Path, tmp_path: Path,
                                                                                 entry: str) -> None:
    bad = tmp_path / "ms"
    shutil.copytree(ms, bad)
    f = bad / RANK / "dump.json"
    obj = json.loads(f.read_text())
    obj["data"][entry]["input_args"][0] = None
    f.write_text(json.dumps(obj, indent=1))
    assert _not_agree(bad, ms) == "not-compared"
    res = torchparity.compare(bad, ms)
    row = res.rows[res.rows["reason"].astype(str).str.startswith("not compared")]
    assert len(row) == 1 and "the bench argument is a tensor" in row["reason"].iat[0]
    assert not res.summary["complete"]
    # and the other way round (the tensor on the device side) is not agreement either
    assert _not_agree(ms, bad) == "not-compared"


def test_seed_304_msprobe_bytes_that_are_not_utf8_are_damage(ms: Path, tmp_path: Path) -> None:
    """A flipped byte (0x74 ^ 0x81 = 0xf5) inside the key ``data_name`` was decoded as U+FFFD: the leaf
    lost its tensor file unseen and was compared on statistics only."""
    bad = tmp_path / "ms"
    shutil.copytree(ms, bad)
    f = bad / RANK / "dump.json"
    raw = f.read_bytes()
    i = raw.index(b'"data_name"') + 3
    f.write_bytes(raw[:i] + bytes([raw[i] ^ 129]) + raw[i + 1:])
    lost = _reader_damage(bad)
    assert lost and "dump.json" in lost[0] and "not UTF-8" in lost[0]
    assert _not_agree(bad, ms) == "refused"


def _rewrite_summary(clean: Path, out: Path, table: str, edit: Callable[[Any], Any]) -> Path:
    """Copy ``clean`` to ``out`` and rewrite one Parquet summary with ``edit(table)``, keeping its
    metadata (fingerprint of records.jsonl included): what a byte flip that Parquet cannot detect
    does (no page checksums by default), without depending on one pyarrow's byte layout."""
    import pyarrow.parquet as pq

    from torchparity.dump import columnar

    shutil.copytree(clean, out)
    p = columnar.part_path(out, table, 0, 0)
    t = pq.read_table(p)
    pq.write_table(edit(t).replace_schema_metadata(t.schema.metadata), p, compression="zstd")
    return out


@pytest.mark.parametrize("seed, mode, table", [(175, "tensor", "ops"), (237, "statistics", "tensors")])
def test_seeds_175_237_a_changed_summary_is_not_compared(dumps: dict[str, Path], tmp_path: Path, seed: int,
                                                         mode: str, table: str) -> None:
    """bench_fuzz --seed 42 (2026-11-25, after the Parquet summaries became the compare's source):
    a byte flip left part.parquet readable with an op name ``Aten.t.6.bwacward`` (seed 175) or a
    producer link to record 199 (seed 237) and the compare said 'agree' from the changed summary.
    Each summary file now has an XXH3 digest beside it; a file that does not match is not used and
    the compare reads records.jsonl (the source of truth) with a one-line note."""
    import pyarrow as pa

    def edit(t: Any) -> Any:
        if table == "ops":  # rename one op, as seed 175's flip did
            names = t.column("name").to_pylist()
            names[-1] = names[-1][:-8] + "bwacward"
            return t.set_column(t.schema.get_field_index("name"), "name", pa.array(names, t.schema.field("name").type))
        prod = t.column("producer").to_pylist()  # a producer link to a record that does not exist (seed 237)
        k = next(i for i, x in enumerate(prod) if x is not None)
        prod[k] = {**prod[k], **{next(iter(prod[k])): 199}} if isinstance(prod[k], dict) else [199, *list(prod[k])[1:]]
        return t.set_column(t.schema.get_field_index("producer"), "producer",
                            pa.array(prod, t.schema.field("producer").type))

    bad = _rewrite_summary(dumps[mode], tmp_path / "m", table, edit)
    warnings: list[str] = []
    u = open_dump(bad).units[0]
    frame = read_unit(u, warnings, compact=True)
    clean_frame = read_unit(open_dump(dumps[mode]).units[0], [], compact=True)
    assert any("does not match its digest" in w and "records.jsonl instead" in w for w in warnings), warnings
    assert sorted(frame["name"].tolist()) == sorted(clean_frame["name"].tolist())  # the JSONL's, not the summary's
    assert [repr(x) for x in frame.sort_values("record_id", kind="stable")["producer"]] == \
        [repr(x) for x in clean_frame.sort_values("record_id", kind="stable")["producer"]]
    res = torchparity.compare(bad, dumps[mode])
    assert not res.diverged and any("does not match its digest" in w for w in res.summary["warnings"])


def test_a_summary_without_its_digest_is_not_used(dumps: dict[str, Path], tmp_path: Path) -> None:
    """A summary whose digest file is gone (deleted, or written before the digests existed) is
    skipped silently like a missing one: the compare reads records.jsonl."""
    import pyarrow as pa

    from torchparity.dump import columnar

    def edit(t: Any) -> Any:
        names = t.column("name").to_pylist()
        names[0] = names[0] + "X"
        return t.set_column(t.schema.get_field_index("name"), "name", pa.array(names, t.schema.field("name").type))

    bad = _rewrite_summary(dumps["statistics"], tmp_path / "m", "ops", edit)
    columnar.digest_path(columnar.part_path(bad, "ops", 0, 0)).unlink()
    u = open_dump(bad).units[0]
    assert columnar.summary_state(u) == ("absent", None)
    warnings: list[str] = []
    frame = read_unit(u, warnings, compact=True)
    assert warnings == [] and not any(str(n).endswith("X") for n in frame["name"].tolist())


@pytest.mark.parametrize("flip", [("data_name", "data_naMe"), ("data_name", "daxa_name"), ("data_name", "dataname"),
                                  ("requires_grad", "requires_grads")])
def test_seed_20135_msprobe_key_one_edit_from_a_missing_key_is_damage(ms: Path, tmp_path: Path,
                                                                      flip: tuple[str, str]) -> None:
    """A flipped byte turned ``data_name`` into ``data_naMe`` (0x6d ^ 32): the tensor entry lost its
    file unseen and the compare said 'agree' on statistics alone (10,000-case run, seed 20135)."""
    old, new = flip
    bad = tmp_path / "ms"
    shutil.copytree(ms, bad)
    f = bad / RANK / "dump.json"
    raw = f.read_text()
    assert f'"{old}"' in raw
    f.write_text(raw.replace(f'"{old}"', f'"{new}"', 1))
    lost = _reader_damage(bad)
    assert lost and "dump.json" in lost[0] and f"'{new}'" in lost[0] and f"'{old}' belongs" in lost[0]
    assert _not_agree(bad, ms) == "refused"


def test_msprobe_keys_of_a_newer_version_are_not_damage(ms: Path, tmp_path: Path) -> None:
    """A key with a name of its own (as a newer msprobe might add) is read past, not refused."""
    good = tmp_path / "ms"
    shutil.copytree(ms, good)
    f = good / RANK / "dump.json"
    f.write_text(f.read_text().replace('"requires_grad"', '"tensor_stat_index": 3, "requires_grad"'))
    assert _reader_damage(good) == []
    assert torchparity.compare(good, ms).summary["n_error"] == 0


def test_seed_40660_msprobe_null_data_name_is_damage(ms: Path, tmp_path: Path) -> None:
    """``"data_name": null`` on a tensor that had a file (msprobe writes a name or leaves the key
    out): the compare judged the entry on statistics alone and said 'agree'."""
    bad = tmp_path / "ms"
    shutil.copytree(ms, bad)
    f = bad / RANK / "dump.json"
    obj = json.loads(f.read_text())
    leaf = obj["data"]["Functional.linear.0.forward"]["output"][0]
    assert leaf.get("data_name")
    leaf["data_name"] = None
    f.write_text(json.dumps(obj, indent=1))
    lost = _reader_damage(bad)
    assert lost and "'data_name' is None" in lost[0]
    assert _not_agree(bad, ms) == "refused"


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_seeds_40787_42308_negative_producer_is_damage(dumps: dict[str, Path], tmp_path: Path, mode: str) -> None:
    """A producer link ``[-3, 0]`` (no record has a negative id) was read and compared as 'agree'."""
    clean = dumps[mode]

    def edit(rec: dict[str, Any]) -> None:
        t = next(t for t in rec["tensors"] if t.get("producer"))
        t["producer"][0] = -3

    line = next(i for i, s in enumerate((clean / RANK / "records.jsonl").read_text().splitlines(), 1)
                if any(t.get("producer") for t in json.loads(s).get("tensors") or []))
    bad = _edit_record(clean, tmp_path / "bad", line, edit)
    lost = _reader_damage(bad)
    assert lost and "producer is [-3," in lost[0]
    assert _not_agree(bad, clean) == "refused"


@pytest.mark.parametrize("field,value", [("backend", -3), ("backend", "cpu"), ("level", 5), ("compile", [1]),
                                         ("backend.numerics", 7), ("world", "x")])
def test_seed_40016_header_field_of_the_wrong_type_is_a_warning_not_a_traceback(dumps: dict[str, Path], tmp_path: Path,
                                                                                field: str, value: Any) -> None:
    """``"backend": -3`` in header.json reached the compare's environment check as a TypeError."""
    clean = dumps["statistics"]
    bad = tmp_path / "bad"
    shutil.copytree(clean, bad)
    h = bad / RANK / "header.json"
    obj = json.loads(h.read_text())
    if "." in field:
        a, b = field.split(".")
        obj[a][b] = value
    else:
        obj[field] = value
    h.write_text(json.dumps(obj))
    res = torchparity.compare(bad, clean)
    assert not res.diverged and any("header.json" in w and f"'{field}'" in w for w in res.summary["warnings"])
    from torchparity.cli import main as cli_main

    with pytest.raises(SystemExit) as ei:
        cli_main(["info", str(bad)])
    assert ei.value.code == 0


@pytest.mark.parametrize("mode,name,op", [("statistics", "Aten.0.0.backward", None), ("tensor", "Aten.t.1.bac}ward", None),
                                          ("statistics", "Aten.mm.0.forward", None),
                                          ("statistics", None, "aten.t.3efault"), ("tensor", None, "aten4t.default")])
def test_seeds_60848_61636_81880_80828_aten_name_and_op_that_do_not_agree_are_damage(
        dumps: dict[str, Path], tmp_path: Path, mode: str, name: str | None, op: str | None) -> None:
    """A flipped byte in a record's name or op left another plausible one (``Aten.t.0.backward`` ->
    ``Aten.0.0.backward``, ``Aten.t.1.bac}ward``; ``aten.t.default`` -> ``aten.t.3efault``,
    ``aten.mm.default`` -> ``aten4mm.default``): the record was compared under it and the compare said
    'agree'. An aten record's name spells its op and phase, and its op is namespace.name.overload."""
    clean = dumps[mode]
    lines = (clean / RANK / "records.jsonl").read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if json.loads(x)["op"] == "aten.t.default"
                and json.loads(x)["phase"] == "backward")
    bad = _edit_record(clean, tmp_path / "bad", line, lambda r: r.update({"name": name} if name else {"op": op}))
    lost = _reader_damage(bad)
    assert lost and "do not agree" in lost[0]
    assert _not_agree(bad, clean) == "refused"


def test_seed_62300_tensor_file_without_its_key_is_damage(dumps: dict[str, Path], tmp_path: Path) -> None:
    """``"file"`` flipped to ``"filO"``: the entry kept its key but lost its tensor file, and was
    compared on statistics alone (the writer sets both or neither)."""
    clean = dumps["tensor"]
    lines = (clean / RANK / "records.jsonl").read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if any(t.get("file") for t in json.loads(x)["tensors"]))

    def edit(rec: dict[str, Any]) -> None:
        t = next(t for t in rec["tensors"] if t.get("file"))
        t["filO"] = t.pop("file")

    bad = _edit_record(clean, tmp_path / "bad", line, edit)
    lost = _reader_damage(bad)
    assert lost and "has a key 'filO' where 'file' belongs" in lost[0]
    assert _not_agree(bad, clean) == "refused"
    # the same with the key name intact but the file dropped: the writer sets both or neither
    bad2 = _edit_record(clean, tmp_path / "bad2", line, lambda rec: next(t for t in rec["tensors"] if t.get("file")).pop("file"))
    lost = _reader_damage(bad2)
    assert lost and "a key but no file" in lost[0]


def test_seed_80009_msprobe_renamed_backward_paired_by_shape_is_said(ms: Path, tmp_path: Path) -> None:
    """``Functional.linear.0.backward`` flipped to ``Functional.linOar.0.backward``: the compare paired
    it with the bench's linear backward by shape and position and said 'agree' without a word. The
    numbers are compared (they agree), and a warning line now names the pairing across ops."""
    bad = tmp_path / "ms"
    shutil.copytree(ms, bad)
    f = bad / RANK / "dump.json"
    f.write_text(f.read_text().replace('"Functional.linear.0.backward"', '"Functional.linOar.0.backward"'))
    res = torchparity.compare(bad, ms)
    w = [x for x in res.summary["warnings"] if "paired across different ops" in x]
    assert len(w) == 1 and "functional.linOar with torch.nn.functional.linear" in w[0]
    assert not [x for x in torchparity.compare(ms, ms).summary["warnings"] if "paired across" in x]


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
@pytest.mark.parametrize("link", [[1, 2], [999, 0], "self"])  # 999: not earlier
def test_seed_102155_producer_that_names_no_earlier_output_is_damage(dumps: dict[str, Path], tmp_path: Path,
                                                                    mode: str, link: Any) -> None:
    """A producer ``[1, 0]`` flipped to ``[1, 2]`` (record 1 has one output) was compared as 'agree';
    so would a link to a record that does not exist, or to the record itself."""
    clean = dumps[mode]
    lines = (clean / RANK / "records.jsonl").read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if any(t.get("producer") for t in json.loads(x)["tensors"]))

    def edit(rec: dict[str, Any]) -> None:
        t = next(t for t in rec["tensors"] if t.get("producer"))
        t["producer"] = [rec["id"], 0] if link == "self" else list(link)

    bad = _edit_record(clean, tmp_path / "bad", line, edit)
    lost = _reader_damage(bad)
    assert lost and "names no output of an earlier record" in lost[0]
    assert _not_agree(bad, clean) == "refused"


@pytest.mark.parametrize("where,old,new", [("record", "call_index", "call_ixdex"), ("record", "module", "modulE"),
                                           ("entry", "stats", "stat"), ("entry", "dtype", "dtypo")])
def test_seed_120281_a_key_one_edit_from_a_missing_key_is_damage(dumps: dict[str, Path], tmp_path: Path, where: str,
                                                                 old: str, new: str) -> None:
    """``"call_index"`` flipped to ``"call_ixdex"``: the reader read the default call index 0 in
    its place and the compare said 'agree' (10,000-case run, seed 120281)."""
    clean = dumps["tensor"]
    lines = (clean / RANK / "records.jsonl").read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if json.loads(x)["call_index"] == 1)

    def edit(rec: dict[str, Any]) -> None:
        d = rec if where == "record" else rec["tensors"][0]
        d[new] = d.pop(old)

    bad = _edit_record(clean, tmp_path / "bad", line, edit)
    lost = _reader_damage(bad)
    assert lost and f"has a key '{new}' where '{old}' belongs" in lost[0]
    assert _not_agree(bad, clean) == "refused"


def test_keys_of_a_newer_writer_are_read_past(dumps: dict[str, Path], tmp_path: Path) -> None:
    clean = dumps["statistics"]

    def edit(rec: dict[str, Any]) -> None:
        rec["cost_ns"] = 5
        rec["tensors"][0]["layout"] = "strided"

    good = _edit_record(clean, tmp_path / "good", 1, edit)
    assert _reader_damage(good) == []
    assert not torchparity.compare(good, clean).diverged
