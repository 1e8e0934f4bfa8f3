"""Read msprobe dumps (``dump.json``, ``stack.json``, ``construct.json``, ``dump_tensor_data/``).

msprobe names and fields are mapped to torchparity's columns:

* ``input_args`` / ``input_kwargs`` (forward) and ``input`` (backward) -> ``io="input"``;
  ``output`` -> ``output``; a module's ``parameters`` -> ``param``; ``parameters_grad`` records
  -> ``grad`` (phase ``backward``).
* ``Functional.linear.3.backward`` -> op ``torch.nn.functional.linear``, phase ``backward``,
  level ``api``; ``Module.blocks.0.mlp.MLP.forward.0`` -> op ``MLP``, module ``blocks.0.mlp``,
  level ``module``. API records take their module from ``construct.json`` (their parent module
  record); ops whose parent is ``optimizer`` get phase ``optimizer``.
* ``call_index`` is recomputed per (phase, module, op), in dump.json order, like torchparity's.

A truncated or corrupt ``dump.json`` (msprobe rewrites it whole and a killed process leaves it
cut) is parsed entry by entry with :meth:`json.JSONDecoder.raw_decode`, keeping every complete
entry. ``.pt`` files are read only on demand with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DumpError
from .columns import COLUMNS, dtype_ok, empty_frame
from .damage import Damage
from .keys import damaged_key
from .tensors import PtRef

if TYPE_CHECKING:
    from .units import DumpUnit

_MODULE_RE = re.compile(r"^Module\.(?:(.*)\.)?([^.]+)\.(forward|backward|parameters_grad)(?:\.(\d+))?$")
_API_RE = re.compile(r"^([A-Za-z0-9_]+)\.(.+)\.(\d+)\.(forward|backward)$")
_PREFIX_NS = {
    "Functional": "torch.nn.functional",
    "Torch": "torch",
    "Tensor": "torch.Tensor",
    "Distributed": "torch.distributed",
    "Aten": "aten",
    "VF": "torch._VF",
    "NPU": "torch_npu",
}
_NONFINITE = {"NaN": math.nan, "nan": math.nan, "Infinity": math.inf, "inf": math.inf,
              "-Infinity": -math.inf, "-inf": -math.inf}


def parse_name(name: str) -> dict[str, Any]:
    """Split an msprobe record name into op, level, phase, module path and class."""
    m = _MODULE_RE.match(name)
    if m:
        path, cls, phase, _ = m.groups()
        return {"op": cls, "level": "module", "phase": "backward" if phase != "forward" else "forward",
                "module": path or "", "module_class": cls, "param_grad": phase == "parameters_grad"}
    m = _API_RE.match(name)
    if m:
        prefix, api, _, phase = m.groups()
        ns = _PREFIX_NS.get(prefix, prefix)
        return {"op": f"{ns}.{api}", "level": "aten" if prefix == "Aten" else "api", "phase": phase,
                "module": None, "module_class": None, "param_grad": False}
    return {"op": name, "level": "api", "phase": "backward" if ".backward" in name else "forward",
            "module": None, "module_class": None, "param_grad": False}


def _partial_data(text: str, rel: str, warnings: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Recover the complete entries of a truncated/corrupt dump.json.

    Returns (top-level fields before ``data``, data entries).
    """
    dec = json.JSONDecoder()
    head: dict[str, Any] = {}
    for key in ("task", "level", "framework"):
        m = re.search(r'"%s"\s*:\s*"([^"]*)"' % key, text[:4096])
        if m:
            head[key] = m.group(1)
    m = re.search(r'"data"\s*:\s*\{', text)
    if not m:
        warnings.append(Damage(f"{rel}/dump.json is corrupt and has no readable 'data' section; no records from this rank"))
        return head, {}
    pos = m.end()
    n = len(text)
    entries: dict[str, Any] = {}
    ws = re.compile(r"[\s,]*")
    lost_at = None
    while True:
        pos = ws.match(text, pos).end()
        if pos >= n or text[pos] == "}":
            break
        try:
            key, pos = dec.raw_decode(text, pos)
            pos = re.compile(r"\s*:\s*").match(text, pos).end()  # type: ignore[union-attr]
            value, pos = dec.raw_decode(text, pos)
        except (json.JSONDecodeError, AttributeError, ValueError):
            lost_at = pos
            break
        if isinstance(key, str):
            entries[key] = value
    if lost_at is not None:
        warnings.append(Damage(
            f"{rel}/dump.json is truncated or corrupt at character {lost_at} of {n}: read "
            f"{len(entries)} complete entries, the rest is lost (msprobe rewrites dump.json at each "
            f"flush, so a killed process leaves it cut); re-run the dump for the full step"
        ))
    else:
        warnings.append(Damage(f"{rel}/dump.json is not valid JSON after its 'data' section; read {len(entries)} entries"))
    return head, entries


def read_dump_json(path: Path, rel: str, warnings: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # msprobe writes UTF-8: a byte that is not is damage, never read past
        text = raw.decode("utf-8", errors="replace")
        warnings.append(Damage(f"{rel}/dump.json holds bytes that are not UTF-8 (first at byte {exc.start}); the "
                               f"file was altered or damaged - re-run the dump, or compare the rest with --allow-partial"))
    try:
        obj = json.loads(text)  # accepts msprobe's bare NaN/Infinity tokens
    except json.JSONDecodeError:
        return _partial_data(text, rel, warnings)
    if not isinstance(obj, dict):
        warnings.append(f"{rel}/dump.json does not hold an object; no records from this rank")
        return {}, {}
    data = obj.get("data") or {}
    head = {k: v for k, v in obj.items() if k != "data"}
    return head, data if isinstance(data, dict) else {}


def read_msprobe_header(unit_dir: Path) -> dict[str, Any]:
    """The top-level fields of dump.json (task, level, framework), cheaply."""
    try:
        with open(unit_dir / "dump.json", encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return {}
    head: dict[str, Any] = {"format": "msprobe"}
    for key in ("task", "level", "framework"):
        m = re.search(r'"%s"\s*:\s*"([^"]*)"' % key, text)
        if m:
            head[key] = m.group(1)
    return head


def read_msprobe_stacks(unit_dir: Path) -> tuple[dict[int, list[str]], dict[str, int]]:
    """stack.json -> ({stack id: frames}, {record name: stack id})."""
    path = unit_dir / "stack.json"
    if not path.is_file():
        return {}, {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, json.JSONDecodeError):
        return {}, {}
    stacks: dict[int, list[str]] = {}
    by_name: dict[str, int] = {}
    if not isinstance(obj, dict):
        return stacks, by_name
    for k, v in obj.items():
        try:
            sid = int(k)
        except ValueError:
            continue
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list):
            names, frames = v
            stacks[sid] = [str(f) for f in frames] if isinstance(frames, list) else [str(frames)]
            for nm in names:
                by_name[str(nm)] = sid
        elif isinstance(v, list):  # older layout: {name: frames}
            stacks[sid] = [str(f) for f in v]
    return stacks, by_name


def _read_construct(unit_dir: Path, warnings: list[str], rel: str, needed: bool = True,
                    mixed: bool = False) -> dict[str, Any]:
    """construct.json (API record -> parent module record). ``needed``: dump.json holds API
    records, whose module path is lost without it (reported as damage). ``mixed``: it also holds
    module records (level mix), so an empty construct.json lost the structure (only level L1, API
    records alone, leaves it empty)."""
    path = unit_dir / "construct.json"
    why = None
    obj: Any = {}
    if not path.is_file():
        why = "is missing"
    else:
        try:
            obj = json.loads(path.read_text(encoding="utf-8", errors="replace"))
            if not isinstance(obj, dict):
                why, obj = f"holds {type(obj).__name__}, not an object", {}
        except (OSError, ValueError, RecursionError) as exc:
            why = f"is unreadable ({type(exc).__name__})"
    if not why and not obj and mixed:
        why = "is empty although dump.json holds module and API records (level mix)"
    if why and needed:
        warnings.append(Damage(f"{rel}/construct.json {why}: API records get no module path and may pair "
                               f"with the wrong calls - copy the whole msprobe dump directory"))
    return obj


def _stat(v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):
        return _NONFINITE.get(v, math.nan)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _is_leaf(item: Any) -> bool:
    """A tensor or value description (as opposed to a dict of named arguments)."""
    return isinstance(item, dict) and ("type" in item or "dtype" in item or "Max" in item)


def _stat_ok(v: Any) -> bool:
    return v is None or (type(v) in (int, float)) or (type(v) is str and v in _NONFINITE)


def _safe_name(v: Any) -> bool:
    return type(v) is str and bool(v) and "/" not in v and "\\" not in v and "\x00" not in v and v not in (".", "..")


#: the keys msprobe writes in a tensor description
_TENSOR_KEYS = ("type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "md5", "data_name")


def _damaged_key(t: dict[str, Any]) -> str | None:
    """A key one edit away from a tensor-description key that the entry lacks (``data_naMe`` for
    ``data_name``): a damaged key, whose value no reader would read. A key a newer msprobe adds has
    a name of its own and is left alone."""
    hit = damaged_key(t, _TENSOR_KEYS)
    if hit is not None:
        return f"has a key {_shown(hit[0])} where {hit[1]!r} belongs (a damaged key: its value would be lost)"
    return None


def leaf_problem(t: Any) -> str | None:
    """What is wrong with one leaf of an entry (None when it is valid). A leaf is ``null`` (an
    argument that was None), a tensor description (``dtype``, ``shape``, ``Max``/``Min``/``Mean``/
    ``Norm``, ``requires_grad``, ``md5``, ``data_name``) or a value description (``type`` and
    ``value``); msprobe never writes a bare number, string or list where a description belongs."""
    if t is None:
        return None
    if not isinstance(t, dict):
        return f"is {_what(t)}, not a tensor or value description"
    typ = t.get("type", "")
    if type(typ) is not str:
        return f"'type' is {_what(typ)}, not a type name"
    if not ("Tensor" in typ or ("dtype" in t and "shape" in t)):
        return None  # a value description: any JSON value
    dtype, shape = t.get("dtype"), t.get("shape")
    if type(dtype) is not str or not dtype_ok(dtype):
        return f"is a tensor whose 'dtype' is {_what(dtype)}, not a dtype name"
    if type(shape) is not list or not all(type(x) is int and x >= 0 for x in shape):
        return f"is a tensor whose 'shape' is {_shown(shape)}, not a list of sizes"
    boolean = dtype.replace("torch.", "") == "bool"
    for k in ("Max", "Min", "Mean", "Norm"):
        v = t.get(k)
        if not (_stat_ok(v) or (boolean and type(v) is bool)):
            return f"'{k}' is {_what(v)}, not a number"
    missing = [k for k in ("Max", "Min", "Mean", "Norm") if t.get(k) is None]
    if 0 < len(missing) < 4 and not boolean and math.prod(shape) > 0:
        # msprobe computes all four of a non-empty numeric tensor (a bool tensor has no Mean/Norm)
        return f"is a tensor with {', '.join(missing)} null but other statistics given"
    if t.get("requires_grad") is not None and type(t["requires_grad"]) is not bool:
        return f"'requires_grad' is {_what(t['requires_grad'])}, not true or false"
    if t.get("md5") is not None and type(t["md5"]) is not str:
        return f"'md5' is {_what(t['md5'])}, not a checksum"
    if "data_name" in t and not _safe_name(t["data_name"]):  # msprobe writes a name or leaves the key out
        return f"'data_name' is {_shown(t['data_name'])}, not a file name in dump_tensor_data"
    return _damaged_key(t)


def _parent_ok(parent: Any) -> bool:
    """A construct.json value: null (a call outside every module), a Module record name, or the
    optimizer."""
    return parent is None or (type(parent) is str and (parent.startswith("optimizer")
                                                        or _MODULE_RE.match(parent) is not None))


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _what(v: Any) -> str:
    """'null', or the kind and value of ``v`` (for messages)."""
    return "null" if v is None else f"{_kind(v)} ({_shown(v)})"


def _shown(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


#: the containers of an entry's arguments: key -> (allowed types, shown as)
_CONTAINERS = {"input_args": ((list,), "a list"), "input_kwargs": ((dict,), "an object"),
               "input": ((list, dict, type(None)), "a list"), "output": ((list, dict, type(None)), "a list"),
               "parameters": ((dict,), "an object")}


_FORWARD_KEYS = ("input_args", "input_kwargs", "output")


def entry_problem(entry: dict[str, Any], param_grad: bool) -> str | None:
    """The first wrong value in one dump.json entry (None when it is valid)."""
    if param_grad:
        groups = list(entry.items())
    else:
        unknown = [k for k in entry if k not in _CONTAINERS]
        expected = ("input", "output") if "input_args" not in entry and "input" in entry else _FORWARD_KEYS
        absent = [k for k in expected if k not in entry]
        if unknown and absent:  # a renamed key (a flipped byte): those arguments would vanish unseen
            return f"has {_shown(unknown[0])} but no '{absent[0]}'"
        groups = []
        for key, (types, shown) in _CONTAINERS.items():
            if key in entry:
                if not isinstance(entry[key], types):
                    return f"'{key}' is {_what(entry[key])}, not {shown}"
                groups.append((key, entry[key]))
    for key, payload in groups:
        leaves: list[tuple[str, Any]] = []
        _flatten(payload, "", leaves, raw=True)
        for arg, t in leaves:
            why = leaf_problem(t)
            if why:
                return f"{key}{'.' + arg if arg else ''} {why}"
    return None


def _flatten(item: Any, prefix: str, out: list[tuple[str, Any]], raw: bool = False) -> None:
    """Flatten nested lists/dicts of msprobe tensor descriptions into (arg path, leaf) pairs
    (``raw``: leaves as they are, for :func:`leaf_problem`; else anything but a description is None)."""
    if _is_leaf(item):
        out.append((prefix, item))
    elif isinstance(item, (list, tuple)):
        for i, x in enumerate(item):
            _flatten(x, f"{prefix}.{i}" if prefix else str(i), out, raw)
    elif isinstance(item, dict):
        for k, x in item.items():
            _flatten(x, f"{prefix}.{k}" if prefix else str(k), out, raw)
    else:
        out.append((prefix, item if raw else None))


def read_msprobe_unit(u: DumpUnit, warnings: list[str]) -> Any:
    """Rows of one msprobe rank/proc directory."""
    import pandas as pd

    rel = f"step{u.step}/{u.path.name}"
    _, data = read_dump_json(u.path / "dump.json", rel, warnings)
    if not data:
        return empty_frame()
    has_module = any(str(n).startswith("Module.") for n in data)
    construct = _read_construct(u.path, warnings, rel, needed=not all(str(n).startswith("Module.") for n in data),
                                mixed=has_module)
    _, stack_of = read_msprobe_stacks(u.path)
    tensor_dir = u.path / "dump_tensor_data"
    names = list(data)
    rid = {n: i for i, n in enumerate(names)}
    rows: list[tuple[Any, ...]] = []
    missing_files = 0
    not_objects = [n for n in names if not isinstance(data[n], dict)]
    if not_objects:
        warnings.append(Damage(f"{rel}/dump.json: {len(not_objects)} entr(y/ies) are not objects and were skipped "
                               f"({', '.join(map(str, not_objects[:3]))}{' ...' if len(not_objects) > 3 else ''}); "
                               f"the file was altered or damaged - re-run the dump"))
    bad: list[str] = []
    for i, name in enumerate(names):
        entry = data[name]
        if not isinstance(entry, dict):
            continue
        info = parse_name(name)
        why = entry_problem(entry, info["param_grad"])
        if why is None and not (_MODULE_RE.match(name) or _API_RE.match(name)):
            why = "the name is no msprobe record name (Module.<path>.<Class>.forward.<n> or <Api>.<name>.<n>.forward)"
        parent = construct.get(name)
        if why is None and not _parent_ok(parent):
            why = f"its parent in construct.json is {_what(parent)}, not a module record name"
        elif why is None and isinstance(parent, str) and parent not in construct and parent not in data \
                and not parent.startswith("optimizer"):
            why = f"its parent in construct.json, {_shown(parent)}, is no node of construct.json or dump.json"
        if why:
            bad.append(f"{name}: {why}")
            continue
        phase = info["phase"]
        module, module_class = info["module"], info["module_class"]
        if module is None:
            parent = construct.get(name)
            if parent == "optimizer" or (isinstance(parent, str) and parent.startswith("optimizer")):
                phase = "optimizer" if phase == "forward" else phase
                module = ""
            elif isinstance(parent, str):
                pm = parse_name(parent)
                module, module_class = pm["module"] or "", pm["module_class"]
            else:
                module = ""
        fwd = rid.get(name[: -len(".backward")] + ".forward") if name.endswith(".backward") else None
        if info["param_grad"]:
            groups = [("grad", {k: v for k, v in entry.items()})]
        elif phase == "backward" and ("input" in entry or "output" in entry) and "input_args" not in entry:
            groups = [("input", entry.get("input")), ("output", entry.get("output"))]
        else:
            groups = [("input", entry.get("input_args")), ("input", entry.get("input_kwargs")),
                      ("output", entry.get("output")), ("param", entry.get("parameters"))]
        head = (i, name, info["op"], info["level"], phase, module, module_class, 0, u.step, u.rank, fwd,
                stack_of.get(name), None)
        for io, payload in groups:
            if payload is None:
                continue
            leaves: list[tuple[str, Any]] = []
            _flatten(payload, "", leaves)
            for arg, t in leaves:
                if io == "grad" and arg.endswith(".0"):
                    arg = arg[:-2]
                if t is None:
                    rows.append(head + (io, arg or "0", "none") + (None,) * 5 + (math.nan,) * 6
                                + (None,) * 5 + (None,))
                    continue
                typ = str(t.get("type", ""))
                is_tensor = "Tensor" in typ or ("dtype" in t and "shape" in t)
                if not is_tensor:
                    rows.append(head + (io, arg or "0", "scalar", typ or None, None, None, None, None)
                                + (math.nan,) * 6 + (None, t.get("value"), None, None, None, None))
                    continue
                dtype = str(t.get("dtype", "")).replace("torch.", "") or None
                shape = tuple(t["shape"]) if isinstance(t.get("shape"), list) else None
                data_name = t.get("data_name")
                ref = None
                file = None
                if data_name:
                    file = f"dump_tensor_data/{data_name}"
                    ref = PtRef(tensor_dir / str(data_name), None)
                    if not ref.exists():
                        missing_files += 1
                md5 = t.get("md5")
                mx, mn = _stat(t.get("Max")), _stat(t.get("Min"))
                nan = 1.0 if (math.isnan(mx) or math.isnan(mn)) and t.get("Max") is not None else math.nan
                rows.append(head + (
                    io, arg or "0", "tensor", dtype, shape, None, None, t.get("requires_grad"),
                    mx, mn, _stat(t.get("Mean")), _stat(t.get("Norm")), nan, math.nan,
                    str(md5) if md5 is not None else None, None, file, None, None, ref,
                ))
    fwd_api = [n for n in names if isinstance(data[n], dict) and not str(n).startswith("Module.")
               and str(n).endswith(".forward")]
    orphans = [n for n in fwd_api if n not in construct]
    if construct and orphans:
        # msprobe records every forward call in construct.json (mix level) or none (api level)
        warnings.append(Damage(
            f"{rel}/construct.json names no parent for {len(orphans)} API record(s) of dump.json "
            f"({', '.join(map(str, orphans[:3]))}{' ...' if len(orphans) > 3 else ''}): they get no module path and "
            f"may pair with the wrong calls; the file was altered or damaged - copy the whole msprobe dump directory"
        ))
    if bad:
        warnings.append(Damage(
            f"{rel}/dump.json: {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} with wrong values skipped "
            f"({'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); read {len(names) - len(not_objects) - len(bad)} "
            f"entries - the file was altered or damaged; re-run the dump, or compare the rest with --allow-partial"
        ))
    if missing_files:
        warnings.append(Damage(
            f"{rel}: {missing_files} tensor file(s) named in dump.json are missing from dump_tensor_data; "
            f"those rows are compared on statistics only"
        ))
    if not rows:
        return empty_frame()
    df = pd.DataFrame.from_records(rows, columns=COLUMNS)
    for c in ("max", "min", "mean", "norm", "nan", "inf"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    # call_index: per (phase, module, op), in dump order, counted over records (not tensor rows)
    rec = df.drop_duplicates("record_id")[["record_id", "phase", "module", "op"]]
    ci = rec.groupby(["phase", "module", "op"], sort=False).cumcount()
    df["call_index"] = df["record_id"].map(dict(zip(rec["record_id"], ci))).astype("int64")
    return df
