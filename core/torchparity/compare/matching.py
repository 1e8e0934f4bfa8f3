"""Pair device records with bench records, even when the two op sequences differ.

Stages, in order (each sees only what earlier stages left unmatched):

1. ``exact``: (phase, module, op, call_index), for (phase, module, op) groups with the same
   number of calls on both sides; a group whose calls ran in another order on one side (pairs by
   ``call_index`` would join different tensor shapes) is paired by (shapes, occurrence) instead;
2. ``no_counter``: inside groups whose call counts differ (an extra call, a missing call), an
   order-preserving alignment on the tensor shapes of each call;
3. ``shape``: same phase and module, a different op with the same shapes (a fused op on one
   side: ``addmm`` vs ``mm`` + ``add``), order-preserving;
4. ``align``: what is left, across modules (renamed modules), by op and shapes: an LCS-like
   alignment (:class:`difflib.SequenceMatcher`) for small leftovers, per-key order otherwise. Two
   records of different module paths pair only when each path is absent from the other side (a
   rename); a record moved into a module both sides have stays unmatched.

Then ``forward``: a backward record that names its forward record (``fwd``) is the backward of
that forward call, whatever order autograd ran it in. When the two forward records are paired,
their backward records (same op, in order) are paired with each other, replacing what the
counters paired. A bf16 run's casts (RMSNorm's ``.to(float32)`` and back) are real autograd nodes,
an fp32 run's are no-ops whose backward records come at another time: the per-op backward
counters drift, the forward counters do not.

A layer mapping (``{device_name: bench_name}``, e.g. ``linear_qkv: query_key_value``) renames
device module path components (or whole path prefixes) before matching. Nothing here raises on
length mismatches: whatever cannot be paired is returned as unmatched.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import UsageError

REC_KEYS = ["phase", "mkey", "op"]
#: dtype casts (aten, torch API and prims names): a cast to the dtype a tensor already has is a
#: no-op (an alias, or not dispatched at all), so a bf16 run has casts that an fp32 run lacks
CAST_OPS = re.compile(r"(^|\.)(_to_copy|to|float|half|bfloat16|double|type|type_as|_autocast_to_reduced_precision"
                      r"|_autocast_to_full_precision|convert_element_type)(\.[A-Za-z_]+)?$")


def is_cast(op: Any) -> bool:
    """Whether ``op`` (a record's op name) is a dtype cast."""
    return isinstance(op, str) and bool(CAST_OPS.search(op.replace("torch.Tensor.", "")))


def load_layer_mapping(mapping: str | Path | Mapping[str, str] | None) -> dict[str, str]:
    """A layer mapping from a YAML file or a dict (device module name -> bench module name).

    Names are strings (numbers are read as their text); anything else, a file that is not UTF-8
    text or not YAML, is a one-line :class:`UsageError` naming the file."""
    if mapping is None:
        return {}
    if isinstance(mapping, Mapping):
        return {str(k): str(v) for k, v in mapping.items()}
    import yaml

    p = Path(mapping)
    if not p.is_file():
        raise UsageError(f"layer mapping {p} does not exist; pass a YAML file of 'device_name: bench_name' lines")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(" ".join(f"layer mapping {p} is not valid YAML: {exc}".split())) from None
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"layer mapping {p} is not a UTF-8 text file; write 'device_name: bench_name' lines") from None
    except (OSError, RecursionError) as exc:
        raise UsageError(f"cannot read layer mapping {p}: {type(exc).__name__}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"layer mapping {p} must be a mapping of 'device_name: bench_name' lines")

    def name(v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or v == "":
            raise UsageError(f"layer mapping {p}: {v!r:.40} is not a module name; write 'device_name: bench_name' lines")
        return str(v)

    flat: dict[str, str] = {}
    for k, v in data.items():  # allow one level of grouping (msprobe-style sections)
        if isinstance(v, dict):
            flat.update({name(a): name(b) for a, b in v.items()})
        else:
            flat[name(k)] = name(v)
    return flat


def map_module(path: str, mapping: Mapping[str, str]) -> str:
    """Apply a layer mapping to one module path (prefix mapping first, then per component)."""
    if not mapping or not path:
        return path
    for src in sorted((k for k in mapping if "." in k), key=len, reverse=True):
        if path == src or path.startswith(src + "."):
            return mapping[src] + path[len(src):]
    return ".".join(mapping.get(p, p) for p in path.split("."))


def _text(v: Any, missing: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return missing
    return v if isinstance(v, str) else str(v)


def text_column(s: Any, missing: str = "") -> Any:
    """``s`` as an object Series of Python ``str``: missing values (None/NaN) become ``missing``.

    Not ``astype(str)``: pandas >= 3 keeps missing values as NaN there (a float in what the
    callers join as text), pandas < 3 turns them into ``"None"``/``"nan"``. Computed once per
    distinct value; unhashable values (a list where a name belongs, in a damaged dump) are
    converted one by one.
    """
    import pandas as pd

    vals = s.to_numpy(dtype=object)
    try:
        codes, uniq = pd.factorize(vals)
    except TypeError:  # unhashable values
        return pd.Series([_text(v, missing) for v in vals], index=s.index, dtype=object)
    labels = np.array([_text(u, missing) for u in uniq] + [missing], dtype=object)
    return pd.Series(labels[codes], index=s.index, dtype=object)


def record_table(rows: Any, mapping: Mapping[str, str] | None = None) -> Any:
    """One line per record: record_id, phase, module, mkey (mapped module), op, call_index, sig."""
    import pandas as pd

    cols = ["record_id", "name", "phase", "module", "op", "call_index", "level"] + (["fwd"] if "fwd" in rows else [])
    rec = rows.drop_duplicates("record_id")[cols].copy()
    mods = text_column(rec["module"])
    if mapping:
        uniq = {m: map_module(m, mapping) for m in mods.unique()}
        rec["mkey"] = mods.map(uniq)
    else:
        rec["mkey"] = mods
    rec = rec.sort_values("record_id", kind="stable").reset_index(drop=True)
    _key_param_grads(rec)
    rec["sig"] = pd.Series(dtype=object)
    return rec


def _key_param_grads(rec: Any) -> None:
    """A parameter's gradient record (``Grad.head.weight.0.backward``, op ``parameters_grad``) is
    matched by its parameter, not by the order in which the gradients were accumulated: autograd
    may accumulate ``head.bias`` before ``head.weight`` on one side and after on the other (an
    fp16-autocast run's extra cast nodes change the order). Its op key becomes
    ``parameters_grad:<parameter>`` and its call index counts that parameter's gradients."""
    is_pg = (rec["op"].to_numpy(dtype=object) == "parameters_grad") & text_column(rec["name"]).str.startswith("Grad.").to_numpy()
    if not is_pg.any():
        return
    at = np.flatnonzero(is_pg)
    names = rec["name"].to_numpy(dtype=object)[at]
    mods = text_column(rec["module"]).to_numpy(dtype=object)[at]
    ops = []
    for name, mod in zip(names, mods):
        full = name[len("Grad."):].rsplit(".", 2)[0]  # Grad.<module>.<param>.<n>.backward
        ops.append("parameters_grad:" + (full[len(mod) + 1:] if mod and full.startswith(mod + ".") else full))
    col = rec["op"].to_numpy(dtype=object).copy()
    col[at] = ops
    rec["op"] = col
    sub = rec.iloc[at]
    ci = rec["call_index"].to_numpy().copy()
    ci[at] = sub.groupby(["phase", "mkey", "op"], sort=False).cumcount().to_numpy()
    rec["call_index"] = ci


def _signatures(rows: Any, rids: Any) -> dict[int, str]:
    """Shape signature of each record: its tensor shapes by io, joined."""
    sub = rows[rows["record_id"].isin(rids)]
    if not len(sub):
        return {}
    s = text_column(sub["io"]) + ":" + text_column(sub["shape"], missing="-")
    return s.groupby(sub["record_id"], sort=False).agg("|".join).to_dict()


def _align(a: list[str], b: list[str], limit: int = 4000) -> list[tuple[int, int]]:
    """Order-preserving pairs of equal items (LCS-like). Large inputs: per-key order instead."""
    if not a or not b:
        return []
    if len(a) <= limit and len(b) <= limit:
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        return [(blk.a + k, blk.b + k) for blk in sm.get_matching_blocks() for k in range(blk.size)]
    pos: dict[str, list[int]] = {}
    for j, x in enumerate(b):
        pos.setdefault(x, []).append(j)
    taken: dict[str, int] = {}
    out = []
    for i, x in enumerate(a):
        lst = pos.get(x)
        if lst:
            k = taken.get(x, 0)
            if k < len(lst):
                out.append((i, lst[k]))
                taken[x] = k + 1
    return out


def match_records(dev_rows: Any, bench_rows: Any, mapping: Mapping[str, str] | None = None) -> Any:
    """Pair records of one (step, rank). Returns a DataFrame ``dev_rid, bench_rid, match``.

    Unmatched records appear with the other side's id set to -1 and ``match="unmatched"``.
    """
    import pandas as pd

    d = record_table(dev_rows, mapping)
    b = record_table(bench_rows, None)
    pairs: list[Any] = []
    # the string keys as one integer per record, equal on both sides for equal keys (merging and
    # grouping on integers is several times faster than on three string columns); -1: a key is
    # missing, which groups with nothing (as pandas' groupby drops NaN keys)
    d["gk"], b["gk"] = _joint_key(d, b, REC_KEYS)

    # 1. exact key in groups with equal call counts
    dc = d[d["gk"] >= 0].groupby("gk", sort=False).size().rename("nd")
    bc = b[b["gk"] >= 0].groupby("gk", sort=False).size().rename("nb")
    counts = pd.concat([dc, bc], axis=1)
    equal = counts[counts["nd"] == counts["nb"]].reset_index()[["gk"]]
    de = d.merge(equal, on="gk")
    be = b.merge(equal, on="gk")
    ex = _pair_equal_groups(de, be, dev_rows, bench_rows)
    if len(ex):
        pairs.append(pd.DataFrame({"dev_rid": ex["record_id_d"].to_numpy(), "bench_rid": ex["record_id_b"].to_numpy(), "match": "exact"}))
    used_d = set(ex["record_id_d"].tolist())
    used_b = set(ex["record_id_b"].tolist())

    left_d = d[~d["record_id"].isin(used_d)]
    left_b = b[~b["record_id"].isin(used_b)]
    if len(left_d) and len(left_b):
        sig_d = _signatures(dev_rows, left_d["record_id"])
        sig_b = _signatures(bench_rows, left_b["record_id"])
        extra: list[tuple[int, int, str]] = []
        dmod, bmod = dict(zip(d["record_id"].tolist(), d["mkey"].tolist())), dict(zip(b["record_id"].tolist(), b["mkey"].tolist()))
        dmods, bmods = set(dmod.values()), set(bmod.values())

        def stage(keys: list[str], item: str, label: str) -> None:
            nonlocal left_d, left_b
            if not len(left_d) or not len(left_b):
                return
            if keys == REC_KEYS:  # the integer key of the same columns (-1: a missing key, no group)
                keys = "gk"  # one scalar key (grouping by a one-item list yields scalars in pandas < 2, tuples after)
                gb = {k: g for k, g in left_b.groupby(keys, sort=False) if k >= 0}
            else:
                gb = {k: g for k, g in left_b.groupby(keys, sort=False)} if keys else {(): left_b}
            groups = left_d.groupby(keys, sort=False) if keys else [((), left_d)]
            new: list[tuple[int, int, str]] = []
            for k, gd in groups:
                gbk = gb.get(k)
                if gbk is None:
                    continue
                ida, idb = gd["record_id"].tolist(), gbk["record_id"].tolist()
                if item == "sig":
                    a = [sig_d.get(i, "") for i in ida]
                    bb = [sig_b.get(i, "") for i in idb]
                else:
                    a = [f"{o}|{sig_d.get(i, '')}" for o, i in zip(gd["op"], ida)]
                    bb = [f"{o}|{sig_b.get(i, '')}" for o, i in zip(gbk["op"], idb)]
                got = [(ida[x], idb[y], label) for x, y in _align(a, bb)]
                if label == "align":  # across modules only where the paths look renamed (gone from the other side)
                    got = [p for p in got if dmod[p[0]] == bmod[p[1]] or (dmod[p[0]] not in bmods and bmod[p[1]] not in dmods)]
                new += got
            if new:
                extra.extend(new)
                nd = {x for x, _, _ in new}
                nb = {y for _, y, _ in new}
                left_d = left_d[~left_d["record_id"].isin(nd)]
                left_b = left_b[~left_b["record_id"].isin(nb)]

        stage(REC_KEYS, "sig", "no_counter")
        stage(["phase", "mkey"], "sig", "shape")
        stage(["phase"], "opsig", "align")
        if extra:
            pairs.append(pd.DataFrame(extra, columns=["dev_rid", "bench_rid", "match"]))
    matched = pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame(
        {"dev_rid": pd.Series(dtype="int64"), "bench_rid": pd.Series(dtype="int64"), "match": pd.Series(dtype=object)})
    matched = _pair_backward_by_forward(d, b, matched, _identity_casts(dev_rows, d), _identity_casts(bench_rows, b))
    md = set(matched["dev_rid"].tolist())
    mb = set(matched["bench_rid"].tolist())
    ud = d.loc[~d["record_id"].isin(md), "record_id"].to_numpy()
    ub = b.loc[~b["record_id"].isin(mb), "record_id"].to_numpy()
    un = [pd.DataFrame({"dev_rid": ud, "bench_rid": -1, "match": "unmatched"}),
          pd.DataFrame({"dev_rid": -1, "bench_rid": ub, "match": "unmatched"})]
    out = pd.concat([matched] + [u for u in un if len(u)], ignore_index=True)
    out["dev_rid"] = out["dev_rid"].astype("int64")
    out["bench_rid"] = out["bench_rid"].astype("int64")
    return out


def _shape_hashes(dev_rows: Any, bench_rows: Any) -> tuple[Any, Any]:
    """Per record (a Series indexed by record id), a 64-bit hash of its tensors' (io, arg, shape),
    equal on both sides for equal signatures (the text of :func:`_signatures` costs several
    times more on every record). A collision only pairs by ``call_index``, as before."""
    import pandas as pd

    from .metrics import factorize_shapes

    n = len(dev_rows)
    h = np.zeros(n + len(bench_rows), dtype=np.uint64)
    for c, mult in (("shape", 0x9E3779B97F4A7C15), ("io", 0xC2B2AE3D27D4EB4F), ("arg", 0x165667B19E3779F9)):
        vals = np.concatenate([dev_rows[c].to_numpy(dtype=object), bench_rows[c].to_numpy(dtype=object)])
        try:
            codes = factorize_shapes(vals)[0] if c == "shape" else pd.factorize(vals)[0]
        except TypeError:  # an unhashable value where a name belongs (a damaged dump)
            codes = pd.factorize(text_column(pd.Series(vals)).to_numpy(dtype=object))[0]
        h ^= (codes.astype(np.int64) + 2).astype(np.uint64) * np.uint64(mult)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    hd = pd.Series(h[:n]).groupby(dev_rows["record_id"].to_numpy(), sort=False).sum()
    hb = pd.Series(h[n:]).groupby(bench_rows["record_id"].to_numpy(), sort=False).sum()
    return hd, hb


def _pair_equal_groups(de: Any, be: Any, dev_rows: Any, bench_rows: Any) -> Any:
    """Stage 1: pair the records of (phase, module, op) groups with equal call counts by
    ``call_index``, except where the two sides ran the same calls in another order.

    Autograd does not promise an order between independent nodes: an fp16-autocast run's cast
    nodes change when a GRU's gradient accumulations (``add`` of a (192, 64) weight gradient, of a
    (2, 64) hidden-state gradient) run, so the k-th ``add`` of one side is not the k-th of the
    other. Where a pair by ``call_index`` would join records of different tensor shapes, the
    group's records are paired by (shape signature, occurrence) instead, for the signatures both
    sides have; what is left of the group (another model size: no common signature) is paired by
    ``call_index`` order as before, so that shape differences are still reported."""
    import pandas as pd

    cols = ["gk", "call_index", "record_id"]
    ex = de[cols].merge(be[cols], on=["gk", "call_index"], suffixes=("_d", "_b"))
    if not len(ex):
        return ex
    hd, hb = _shape_hashes(dev_rows, bench_rows)
    sd = ex["record_id_d"].map(hd).fillna(0).to_numpy(dtype=np.uint64)
    sb = ex["record_id_b"].map(hb).fillna(0).to_numpy(dtype=np.uint64)
    bad_groups = pd.unique(ex.loc[sd != sb, "gk"])
    if not len(bad_groups):
        return ex[["record_id_d", "record_id_b"]]
    bad = ex["gk"].isin(bad_groups).to_numpy()
    keep = ex.loc[~bad, ["record_id_d", "record_id_b"]]
    g = ex.loc[bad, ["gk", "call_index"]].assign(sig_d=sd[bad], sig_b=sb[bad], rid_d=ex["record_id_d"].to_numpy()[bad],
                                                 rid_b=ex["record_id_b"].to_numpy()[bad]).sort_values(["gk", "call_index"])
    gd = g[["gk", "call_index", "sig_d", "rid_d"]].rename(columns={"sig_d": "sig"})
    gb = g[["gk", "call_index", "sig_b", "rid_b"]].rename(columns={"sig_b": "sig"})
    gd["occ"] = gd.groupby(["gk", "sig"], sort=False).cumcount()
    gb["occ"] = gb.groupby(["gk", "sig"], sort=False).cumcount()
    by_sig = gd.merge(gb[["gk", "sig", "occ", "rid_b"]], on=["gk", "sig", "occ"])
    rest_d = gd[~gd["rid_d"].isin(by_sig["rid_d"])].copy()
    rest_b = gb[~gb["rid_b"].isin(by_sig["rid_b"])].copy()
    rest_d["k"] = rest_d.groupby("gk", sort=False).cumcount()  # still in call_index order
    rest_b["k"] = rest_b.groupby("gk", sort=False).cumcount()
    by_order = rest_d.merge(rest_b[["gk", "k", "rid_b"]], on=["gk", "k"])
    out = [keep] + [x[["rid_d", "rid_b"]].rename(columns={"rid_d": "record_id_d", "rid_b": "record_id_b"})
                    for x in (by_sig, by_order)]
    return pd.concat(out, ignore_index=True)


def _fwd_ids(rec: Any) -> np.ndarray:
    """The ``fwd`` column as int64 (-1: none)."""
    if "fwd" not in rec:
        return np.full(len(rec), -1, dtype=np.int64)
    import pandas as pd

    return pd.to_numeric(rec["fwd"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)


def _identity_casts(rows: Any, rec: Any) -> set[int]:
    """Record ids of casts whose output has the dtype of their input (no-op casts)."""
    import pandas as pd

    codes, uniq = pd.factorize(rec["op"].to_numpy(dtype=object))  # one regex per distinct op, not per record
    casts = np.array([is_cast(u) for u in uniq] + [False], dtype=bool)[codes]
    cand = rec.loc[casts & (rec["phase"] != "backward").to_numpy(), "record_id"]
    if not len(cand):
        return set()
    sub = rows[rows["record_id"].isin(cand) & (rows["arg"].astype(str) == "0") & (rows["kind"] == "tensor")]
    dt = sub.pivot_table(index="record_id", columns="io", values="dtype", aggfunc="first")
    if "input" not in dt or "output" not in dt:
        return set()
    return set(dt.index[(dt["input"] == dt["output"]).to_numpy(dtype=bool)].tolist())


def _pair_backward_by_forward(d: Any, b: Any, matched: Any, same_d: set[int] = frozenset(),
                              same_b: set[int] = frozenset()) -> Any:
    """Re-pair backward records through their forward records (see the module docstring).

    For each pair of forward records, the device's backward records of that forward call and the
    bench's are paired by op, in order, where both sides have the same number of them. Pairs found
    earlier for these records are dropped; a record they had been paired with becomes unmatched
    (or is paired here in turn).

    A cast that is a no-op on one side only (``same_d``/``same_b``: output dtype = input dtype)
    has a backward that measures another quantity there (the gradient of the aliased input, all
    its uses summed): the backward records of such a forward pair stay unmatched on both sides."""
    import pandas as pd

    fd, fb = _fwd_ids(d), _fwd_ids(b)
    if not (fd >= 0).any() or not (fb >= 0).any() or not len(matched):
        return matched
    fmap = dict(zip(matched["dev_rid"].tolist(), matched["bench_rid"].tolist()))
    groups_b: dict[tuple[int, Any], list[int]] = {}
    for rid, f, op in zip(b["record_id"].tolist(), fb.tolist(), b["op"].tolist()):
        if f >= 0:
            groups_b.setdefault((f, op), []).append(rid)
    groups_d: dict[tuple[int, Any], list[int]] = {}
    for rid, f, op in zip(d["record_id"].tolist(), fd.tolist(), d["op"].tolist()):
        if f >= 0 and fmap.get(f, -1) >= 0:
            groups_d.setdefault((fmap[f], op), []).append(rid)
    fwd_of_d = dict(zip(d["record_id"].tolist(), fd.tolist()))
    fwd_of_b = dict(zip(b["record_id"].tolist(), fb.tolist()))
    new, cut = [], []
    for k, ids in groups_d.items():
        if len(ids) != len(groups_b.get(k, ())):
            continue
        for x, y in zip(ids, groups_b[k]):
            if (fwd_of_d[x] in same_d) != (fwd_of_b[y] in same_b):
                cut.append((x, y))
            else:
                new.append((x, y))
    if not new and not cut:
        return matched
    nd = {x for x, _ in new + cut}
    nb = {y for _, y in new + cut}
    old = dict(zip(matched["dev_rid"].tolist(), matched["bench_rid"].tolist()))
    if not cut and all(old.get(x) == y for x, y in new):
        return matched
    keep = matched[~matched["dev_rid"].isin(nd) & ~matched["bench_rid"].isin(nb)]
    changed = pd.DataFrame([(x, y, "exact" if old.get(x) == y else "forward") for x, y in new],
                           columns=["dev_rid", "bench_rid", "match"])
    return pd.concat([keep, changed], ignore_index=True)


def _joint_key(d: Any, b: Any, cols: list[str]) -> tuple[Any, Any]:
    """One int64 per row of ``d`` and of ``b``: equal exactly when the values in ``cols`` are equal
    (across both frames); -1 where one of them is missing (None/NaN)."""
    import numpy as np
    import pandas as pd

    n = len(d)
    key = np.zeros(n + len(b), dtype=np.int64)
    missing = np.zeros(n + len(b), dtype=bool)
    for c in cols:
        vals = np.concatenate([d[c].to_numpy(dtype=object), b[c].to_numpy(dtype=object)])
        codes, uniq = pd.factorize(vals)
        missing |= codes < 0
        key = key * (len(uniq) + 1) + codes
        key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)  # keep it small
    key[missing] = -1
    return key[:n], key[n:]


def pair_rows(dev_rows: Any, bench_rows: Any, pairs: Any) -> Any:
    """Pair tensor rows of matched records by (io, arg). Returns one frame with ``d_*``/``b_*``
    columns and ``match`` (``unmatched`` for a tensor present on one side only)."""
    dv = dev_rows.add_prefix("d_")
    bv = bench_rows.add_prefix("b_")
    p = pairs.rename(columns={"dev_rid": "d_record_id", "bench_rid": "b_record_id"})
    left = dv.merge(p, on="d_record_id", how="left")
    left["b_record_id"] = left["b_record_id"].fillna(-1).astype("int64")
    left["match"] = left["match"].fillna("unmatched")
    both = left.merge(bv, left_on=["b_record_id", "d_io", "d_arg"], right_on=["b_record_id", "b_io", "b_arg"],
                      how="outer", indicator=True)
    # bench rows that did not pair: attach the device record they were matched to (if any)
    bonly = both["_merge"] == "right_only"
    if bonly.any():
        rev = pairs[pairs["bench_rid"] >= 0].set_index("bench_rid")["dev_rid"]
        both.loc[bonly, "d_record_id"] = both.loc[bonly, "b_record_id"].map(rev).fillna(-1).to_numpy()
    both.loc[both["_merge"] != "both", "match"] = "unmatched"
    both["d_record_id"] = both["d_record_id"].fillna(-1).astype("int64")
    return both.drop(columns="_merge")


def loose_pairs_across_ops(pairs: Any, d: Any, b: Any) -> list[tuple[str, str]]:
    """(device op, bench op) of the records paired by shape or position (match ``shape`` /
    ``align``) whose ops differ: the compare judges them on their numbers, and says so (a renamed
    or damaged op name must not pass unseen)."""
    loose = pairs[pairs["match"].isin(("shape", "align"))]
    if not len(loose):
        return []
    dop = d.drop_duplicates("record_id").set_index("record_id")["op"].to_dict()
    bop = b.drop_duplicates("record_id").set_index("record_id")["op"].to_dict()
    out = []
    for x, y in zip(loose["dev_rid"].tolist(), loose["bench_rid"].tolist()):
        a, c = dop.get(x), bop.get(y)
        if a != c:
            out.append((str(a), str(c)))
    return out
