"""Property-based fuzzing of every reader, through the entry points users hit.

Mutations: truncation, byte flips, deleted and empty files, duplicated and reordered lines, and
JSON values replaced by values of other types. Properties, for every mutated input:

* no traceback: the only exceptions are :class:`~torchparity.errors.TorchparityError` with a
  one-line message (CLI: exit code 0/1 with a result or 2 with one line, never 1 with a traceback);
* nothing corrupted or missing is reported as a pass. The rule: a compare of the mutated dump
  against its clean copy may say "agree" (no divergence, no damage reported) only when what the
  compare reads is unchanged: every compared row has the same identity (name, op, module,
  phase, io, arg, kind, dtype, shape ...) and statistics/tensors within 1 % of the clean ones (a
  flipped bit deep in a float, a flipped byte inside a call-stack string or header field the
  compare does not read; the order of the lines is not compared, and statistics of rows judged on
  their saved tensors are not either). Anything else must be refused as damage, show as a
  divergence or a warning row, or show rows present on one side only as unmatched (a valid
  value the reader cannot know is wrong: a renamed argument, an msprobe output set to null);
* no pickle ever runs.

The CI run is derandomized and small (``FUZZ_EXAMPLES``); ``bench/bench_fuzz.py`` runs the same
engine for >= 10,000 cases.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("TORCHPARITY_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
WRONG_VALUES: list[Any] = [None, "oops", "1.5", -3, 2.5, True, [], [1, "a"], {}, {"a": 1}, "", "../x", 10**30]


# ---- mutations -----------------------------------------------------------------------------------


@dataclass
class Mutation:
    """What was done to which file (for the failure message and the bench's counts)."""

    file: str
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.file} {self.detail}".strip()


def _json_paths(v: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _json_paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _json_paths(x, prefix + (i,))


def _set_path(v: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    v[path[0]] = _set_path(v[path[0]], path[1:], value)
    return v


def mutate(draw: Any, root: Path) -> Mutation:
    """Apply one drawn mutation to one drawn file under ``root``. ``draw``: hypothesis' ``data.draw``,
    or a :class:`random.Random` (``bench/bench_fuzz.py``: no shrinking, a fraction of the cost)."""
    if hasattr(draw, "randint"):
        def pick(seq: Any) -> Any:
            return draw.choice(list(seq))

        integer = draw.randint
    else:
        def pick(seq: Any) -> Any:
            return draw(st.sampled_from(seq))

        def integer(lo: int, hi: int) -> int:
            return draw(st.integers(lo, hi))
    files = sorted(p for p in root.rglob("*") if p.is_file())
    f = pick(files)
    rel = str(f.relative_to(root))
    data = f.read_bytes()
    kinds = ["truncate", "flip", "delete", "empty"]
    lines = data.split(b"\n")
    if f.suffix in (".jsonl",) and len(lines) > 2:
        kinds += ["duplicate_line", "swap_lines", "drop_line", "wrong_type", "wrong_type"]
    elif f.suffix in (".json", ".yaml"):
        kinds += ["wrong_type", "wrong_type"]
    kind = pick(kinds)
    if kind == "truncate":
        n = integer(0, max(0, len(data) - 1))
        f.write_bytes(data[:n])
        return Mutation(rel, kind, f"at {n} of {len(data)}")
    if kind == "flip":
        if not data:
            f.write_bytes(b"\xff")
            return Mutation(rel, kind, "empty file -> 0xff")
        i = integer(0, len(data) - 1)
        x = integer(1, 255)
        f.write_bytes(data[:i] + bytes([data[i] ^ x]) + data[i + 1:])
        return Mutation(rel, kind, f"byte {i} ^ {x}")
    if kind == "delete":
        f.unlink()
        return Mutation(rel, kind)
    if kind == "empty":
        f.write_bytes(b"")
        return Mutation(rel, kind)
    body = [ln for ln in lines if ln.strip()]
    if kind in ("duplicate_line", "swap_lines", "drop_line"):
        i = integer(0, len(body) - 1)
        j = integer(0, len(body) - 1)
        if kind == "duplicate_line":
            body.insert(j, body[i])
        elif kind == "swap_lines":
            body[i], body[j] = body[j], body[i]
        else:
            del body[i]
        f.write_bytes(b"\n".join(body) + b"\n")
        return Mutation(rel, kind, f"{i},{j}")
    # wrong_type: a JSON value anywhere replaced by a value of another type
    value = pick(WRONG_VALUES)
    if f.suffix == ".yaml":
        import yaml

        doc = yaml.safe_load(data) if data.strip() else None
        paths = list(_json_paths(doc))
        path = pick(paths)
        f.write_text(yaml.safe_dump(_set_path(doc, path, value)))
        return Mutation(rel, kind, f"{path} = {value!r}")
    if f.suffix == ".jsonl":
        i = integer(0, len(body) - 1)
        doc = json.loads(body[i])
        path = pick(list(_json_paths(doc)))
        body[i] = json.dumps(_set_path(doc, path, value)).encode()
        f.write_bytes(b"\n".join(body) + b"\n")
        return Mutation(rel, kind, f"line {i + 1} {path} = {value!r}")
    doc = json.loads(data)
    path = pick(list(_json_paths(doc)))
    f.write_text(json.dumps(_set_path(doc, path, value)))
    return Mutation(rel, kind, f"{path} = {value!r}")


# ---- properties ----------------------------------------------------------------------------------


class FalsePass(AssertionError):
    """A mutated input reported as agreeing although what is compared changed."""


class Traceback(AssertionError):
    """An exception other than a one-line TorchparityError."""


@contextmanager
def no_pickle() -> Iterator[None]:
    """Fail if anything unpickles (torch.load(weights_only=True) uses its own restricted loader)."""
    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("pickle ran")

    saved = pickle.loads, pickle.load, pickle.Unpickler
    pickle.loads = pickle.load = refuse  # type: ignore[assignment]
    pickle.Unpickler = refuse  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        pickle.loads, pickle.load, pickle.Unpickler = saved  # type: ignore[misc]


def expect_clean_error(fn: Callable[[], Any], mutation: Mutation) -> tuple[Any, str | None]:
    """(result, None) or (None, the one-line error); anything else raises :class:`Traceback`."""
    from torchparity.errors import TorchparityError

    try:
        with no_pickle():
            return fn(), None
    except TorchparityError as exc:
        msg = str(exc)
        if "\n" in msg.strip() or not msg.strip():
            raise Traceback(f"{mutation}: error message is not one line: {msg!r}") from exc
        return None, msg
    except Exception as exc:
        raise Traceback(f"{mutation}: {type(exc).__name__}: {exc}") from exc


def run_cli(args: list[str], mutation: Mutation) -> tuple[int, str]:
    """The CLI in-process: exit code and output; a traceback raises :class:`Traceback`."""
    from torchparity.cli import main

    out, err = StringIO(), StringIO()
    try:
        with no_pickle(), redirect_stdout(out), redirect_stderr(err):
            main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:
        raise Traceback(f"{mutation}: torchparity {args[0]}: {type(exc).__name__}: {exc}") from exc
    text = out.getvalue() + err.getvalue()
    if "Traceback" in text or code not in (0, 1, 2):
        raise Traceback(f"{mutation}: torchparity {args[0]} exit {code}: {text[-500:]}")
    if code == 2 and len([ln for ln in err.getvalue().splitlines() if ln.strip()]) > 1:
        raise Traceback(f"{mutation}: torchparity {args[0]}: error is not one line: {err.getvalue()!r}")
    return code, text


_IDENTITY = ["name", "op", "level", "phase", "module", "call_index", "io", "arg", "kind", "dtype", "shape",
             "md5", "value", "producer"]


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= 1e-2 * max(abs(a), abs(b))


def unchanged_for_compare(clean: Path, mutated: Path, ignore: tuple[str, ...] = ()) -> bool:
    """True when what the compare reads of ``mutated`` equals (tolerance 1 %) what it reads of
    ``clean`` (the rule for an allowed "agree"; see the module docstring), ``ignore`` aside."""
    import torch

    from torchparity.dump.reader import TensorLoader, open_dump, read_unit
    from torchparity.errors import TorchparityError

    try:
        a_r, b_r = open_dump(clean), open_dump(mutated)
        if [(u.step, u.rank) for u in a_r.units] != [(u.step, u.rank) for u in b_r.units]:
            return False
        for ua, ub in zip(a_r.units, b_r.units):
            a, b = read_unit(ua, [], compact=True), read_unit(ub, [], compact=True)
            # the order of the lines is not compared: records are paired by id, name and call index
            a = a.sort_values("record_id", kind="stable").reset_index(drop=True)
            b = b.sort_values("record_id", kind="stable").reset_index(drop=True)
            if len(a) != len(b) or a["record_id"].tolist() != b["record_id"].tolist():
                return False
            for c in _IDENTITY:
                if c in ignore:
                    continue
                if [repr(x) for x in a[c].tolist()] != [repr(x) for x in b[c].tolist()]:
                    return False
            # statistics of rows whose tensors are both saved are not what the compare judges (it
            # judges the tensors, compared below)
            judged = [x is None or y is None for x, y in zip(a["tensor"].tolist(), b["tensor"].tolist())]
            for c in ("max", "min", "mean", "norm", "nan", "inf"):
                if not all(_close(x, y) or not j for x, y, j in zip(a[c].tolist(), b[c].tolist(), judged)):
                    return False
            with TensorLoader() as la, TensorLoader() as lb:
                for x, y in zip(a["tensor"].tolist(), b["tensor"].tolist()):
                    if (x is None) != (y is None):
                        return False
                    if x is not None:
                        tx, ty = la.load(x).double(), lb.load(y).double()
                        if tx.shape != ty.shape or not torch.allclose(tx, ty, rtol=1e-2, atol=1e-6, equal_nan=True):
                            return False
    except (TorchparityError, OSError):
        return False
    return True


@dataclass
class Outcome:
    """What one fuzz case did (the bench counts these)."""

    mutation: Mutation
    result: str  # "refused" | "divergence" | "agree-unchanged" | "result"
    notes: list[str] = field(default_factory=list)


_CLEAN_WARNINGS: dict[str, int] = {}


def clean_warnings(clean: Path) -> int:
    """Warning rows of the clean dump compared with itself (computed once per dump)."""
    import torchparity

    key = str(clean)
    if key not in _CLEAN_WARNINGS:
        _CLEAN_WARNINGS[key] = int(torchparity.compare(clean, clean).summary.get("n_warning", 0))
    return _CLEAN_WARNINGS[key]


def compare_damage(mutated: Path) -> list[str]:
    """The damage the compare's reader (the compact frame) reports. Columns the compare never
    reads (a record's ``step``, ``rank``, ``flags``, ``device``, ``module_class``) are checked by
    :func:`~torchparity.load_dump` and ``info``; a wrong value there changes nothing compared."""
    from torchparity.dump.reader import damage, open_dump, read_unit
    from torchparity.errors import TorchparityError

    try:
        r = open_dump(mutated)
    except TorchparityError as exc:
        return [str(exc)]
    warnings: list[str] = list(r.warnings)
    for u in r.units:
        read_unit(u, warnings, compact=True)
    return damage(warnings)


def check_dump_case(clean: Path, mutated: Path, mutation: Mutation, out_dir: Path, cli: bool = True,
                    ignore: tuple[str, ...] = ()) -> Outcome:
    """Every property of a mutated dump: load_dump, compare (API and CLI), info. ``ignore``: columns
    the mutation may change without being detectable (see :func:`undetectable`)."""
    import torchparity

    expect_clean_error(lambda: torchparity.load_dump(mutated), mutation)
    res, err = expect_clean_error(lambda: torchparity.compare(mutated, clean), mutation)
    if res is None:
        outcome = "refused"
    elif res.diverged:
        outcome = "divergence"
    elif res.summary.get("n_not_compared", 0):
        outcome = "not-compared"  # rows shown as "not compared" (the summary is incomplete): no pass
    elif res.summary.get("n_warning", 0) > clean_warnings(clean):
        outcome = "warning"  # shown as a warning row, not counted as a pass (the compare's judgement)
    elif any("paired across different ops" in w for w in res.summary.get("warnings", [])):
        # a record whose op changed is paired by shape and position and the compare says so in a
        # warning line (the numbers are compared, and they agree)
        outcome = "agree-loose-pair-warned"
    else:
        lost = compare_damage(mutated)
        if lost:
            raise FalsePass(f"{mutation}: compare said 'agree' although the reader reported damage: {lost[:2]}")
        unmatched = res.summary.get("n_unmatched_device", 0) + res.summary.get("n_unmatched_bench", 0)
        if unmatched:  # rows present on one side only are shown as unmatched, never counted as passes
            return Outcome(mutation, "agree-unmatched-shown")
        if not unchanged_for_compare(clean, mutated, ignore):
            raise FalsePass(f"{mutation}: compare said 'agree' although what it compares changed")
        outcome = "agree-unchanged"
    if cli:
        code, text = run_cli(["compare", str(mutated), str(clean), "-o", str(out_dir / "cmp")], mutation)
        if code == 0 and outcome not in ("agree-unchanged", "warning", "agree-loose-pair-warned"):
            raise FalsePass(f"{mutation}: `torchparity compare` exit 0 but the API said {outcome}: {text[-300:]}")
        run_cli(["info", str(mutated)], mutation)
        run_cli(["info", str(mutated), "--json"], mutation)
    return Outcome(mutation, outcome)


# ---- base inputs ---------------------------------------------------------------------------------


def make_real_dump(root: Path, mode: str = "tensor") -> Path:
    """A small real dump (aten level, one step, with stacks.jsonl, modules.jsonl, tensors)."""
    import torch

    import torchparity

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))
    x = torch.randn(3, 4)
    with torchparity.dump(str(root), level="aten", mode=mode, model=model, stack=True, summaries="step"):
        model(x).sum().backward()
    return root


@pytest.fixture(scope="module")
def base_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fuzzbase")
    return {"tensor": make_real_dump(d / "tensor", "tensor"), "statistics": make_real_dump(d / "stats", "statistics")}


@contextmanager
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tpfuzz"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- the tests -----------------------------------------------------------------------------------


def case_torchparity(draw: Any, base: Path, tmp: Path, cli: bool = True) -> Outcome:
    """One mutated copy of our dump ``base``, through load_dump, compare (API, and CLI with info)."""
    mutated = tmp / "dump"
    shutil.copytree(base, mutated)
    mutation = mutate(draw, mutated)
    return check_dump_case(base, mutated, mutation, tmp, cli=cli, ignore=undetectable(mutation))


@FUZZ
@given(data=st.data(), mode=st.sampled_from(["statistics", "tensor"]))
def test_fuzz_torchparity_dump(base_dumps: dict[str, Path], data: st.DataObject, mode: str) -> None:
    with scratch() as tmp:
        case_torchparity(data.draw, base_dumps[mode], tmp)


def make_msprobe_dump(root: Path) -> Path:
    """A small msprobe statistics+tensor dump (dump.json, stack.json, construct.json, a .pt)."""
    import torch

    rank = root / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save(t, rank / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt")

    def desc(x: Any, name: str | None = None) -> dict[str, Any]:
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(x.shape), "Max": float(x.max()),
                "Min": float(x.min()), "Mean": float(x.mean()), "Norm": float(x.norm()), "requires_grad": False,
                **({"data_name": name} if name else {})}

    data = {
        "Functional.linear.0.forward": {"input_args": [desc(t), desc(t)], "input_kwargs": {},
                                        "output": [desc(t, "Functional.linear.0.forward.output.0.pt")]},
        "Module.layers.0.mlp.MLP.forward.0": {"input_args": [desc(t)], "input_kwargs": {}, "output": [desc(t * 2)]},
        "Functional.linear.0.backward": {"input": [desc(t)], "output": [desc(t + 1)]},
    }
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "mix", "framework": "pytorch",
                                                "dump_data_dir": "x", "data": data}, indent=1))
    (rank / "construct.json").write_text(json.dumps({"Functional.linear.0.forward": "Module.layers.0.mlp.MLP.forward.0",
                                                     "Module.layers.0.mlp.MLP.forward.0": None}))
    (rank / "stack.json").write_text(json.dumps({"0": [["Functional.linear.0.forward"], ["train.py:3 in f"]]}))
    return root


def undetectable(mutation: Mutation) -> tuple[str, ...]:
    """Columns a mutation may change without any reader being able to tell: an msprobe
    construct.json parent set to null is exactly what msprobe writes for a call made outside every
    module, so the record honestly shows no module path (its numbers are still compared); a
    tensor entry's ``producer`` set to null is what the writer writes for a value made outside the
    captured ops (a model input, a parameter): the numbers are compared as before, only the
    root cause's lineage of that input is lost (10,000-case run, seed 61288)."""
    if mutation.file.endswith("construct.json") and mutation.kind == "wrong_type" and mutation.detail.endswith("= None"):
        return ("module",)
    if mutation.file.endswith("records.jsonl") and mutation.kind == "wrong_type" \
            and mutation.detail.endswith("'producer') = None"):
        return ("producer",)
    return ()


@pytest.fixture(scope="module")
def msprobe_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_msprobe_dump(tmp_path_factory.mktemp("msbase") / "ms")


def case_msprobe(draw: Any, base: Path, tmp: Path, cli: bool = True) -> Outcome:
    """One mutated copy of the msprobe dump ``base``: load_dump, compare (API), ``info`` (CLI)."""
    mutated = tmp / "ms"
    shutil.copytree(base, mutated)
    mutation = mutate(draw, mutated)
    out = check_dump_case(base, mutated, mutation, tmp, cli=False, ignore=undetectable(mutation))
    if cli:
        run_cli(["info", str(mutated)], mutation)
    return out


@FUZZ
@given(data=st.data())
def test_fuzz_msprobe_dump(msprobe_base: Path, data: st.DataObject) -> None:
    with scratch() as tmp:
        case_msprobe(data.draw, msprobe_base, tmp)


PLUGINS_YAML = """version: 1
plugins:
  disable: [maca]
  enable: []
  modules: []
backends:
  reference: cpu
  options: {cpu: {}}
checkers:
  - allclose: {rtol: 0.001}
  - md5
reporters: [log, json]
"""


def case_plugins_yaml(draw: Any, tmp: Path) -> Outcome:
    """One mutated plugins.yaml through load_config: loaded, or one line naming the file."""
    from torchparity.config import load_config

    (tmp / "plugins.yaml").write_text(PLUGINS_YAML)
    mutation = mutate(draw, tmp)
    p = tmp / "plugins.yaml"
    cfg, err = expect_clean_error(lambda: load_config(p), mutation)
    assert cfg is not None or str(p) in (err or ""), f"{mutation}: error does not name the file: {err}"
    return Outcome(mutation, "result" if cfg is not None else "refused")


@FUZZ
@given(data=st.data())
def test_fuzz_plugins_yaml(data: st.DataObject) -> None:
    with scratch() as tmp:
        case_plugins_yaml(data.draw, tmp)


MAPPING_YAML = "down_proj: down_projX\nmlp:\n  fc1: linear_fc1\n  fc2: linear_fc2\n"


def case_layer_mapping(draw: Any, tmp: Path) -> Outcome:
    """One mutated layer-mapping file: a mapping of names to names, or one line naming the file."""
    from torchparity.compare.matching import load_layer_mapping

    (tmp / "mapping.yaml").write_text(MAPPING_YAML)
    mutation = mutate(draw, tmp)
    p = tmp / "mapping.yaml"
    m, err = expect_clean_error(lambda: load_layer_mapping(p), mutation)
    if m is not None:
        assert all(type(k) is str and type(v) is str for k, v in m.items()), f"{mutation}: {m}"
    else:
        assert str(p) in err, f"{mutation}: error does not name the file: {err}"
    return Outcome(mutation, "result" if m is not None else "refused")


@FUZZ
@given(data=st.data())
def test_fuzz_layer_mapping(data: st.DataObject) -> None:
    with scratch() as tmp:
        case_layer_mapping(data.draw, tmp)


def make_case(root: Path) -> Path:
    import torch

    from torchparity.online.case import save_case

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    out = torch.mm(a, b) * 1.5
    return save_case(root / "case", {"op": "aten.mm.default", "name": "Aten.mm.0.forward", "verdict": "error",
                                     "reference": "cpu", "module": "fc", "step": 0, "rank": 0, "phase": "forward"},
                     (a, b), {}, [out])


@pytest.fixture(scope="module")
def case_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_case(tmp_path_factory.mktemp("case"))


def case_replay(draw: Any, base: Path, tmp: Path) -> Outcome:
    """One mutated replay case directory through load_case: loaded, or one line naming it."""
    from torchparity.online.case import load_case

    case = tmp / "case"
    shutil.copytree(base, case)
    mutation = mutate(draw, case)
    loaded, err = expect_clean_error(lambda: load_case(case), mutation)
    if loaded is None:
        assert str(case) in err, f"{mutation}: error does not name the case: {err}"
    return Outcome(mutation, "result" if loaded is not None else "refused")


@FUZZ
@given(data=st.data())
def test_fuzz_replay_case(case_base: Path, data: st.DataObject) -> None:
    with scratch() as tmp:
        case_replay(data.draw, case_base, tmp)
