"""Creation sites of NaN/Inf in a dump and whether each one reached a sink (harmful) or was
absorbed: the online tracker's rule (:mod:`torchparity.naninf_rule`) applied offline, on the
dump's per-tensor NaN/Inf counts and ``producer`` links.

Per step and rank, records are walked in op order. A record whose output holds NaN/Inf while its
inputs are finite (or that writes a NaN scalar, ``fill_(nan)``, ``out[..., 3] = nan``) is a
*site*. Each non-finite output carries the sites its non-finite inputs carried (through the
producer links) plus its own. An in-place write puts what it carries into the tensor it wrote and,
through a chain of views, into their base (``out[..., 3] = nan`` writes a view of ``out``): later
readers of that base carry it too (the dump links them to the base's producer, or to nothing once
the write bumped the version; a reader with no link is matched to the last written base of the same
shape and dtype). A site is harmful when something it carries is a non-finite output of a sink
(every backward and optimizer op, forward ops outside any module) or a forward output that no later
op reads (the model's output). A non-finite input that no op of the step produced is *entered*
(a parameter or batch that already held NaN). If such a value reaches a sink, the lineage is
incomplete: every site of that step counts as (possibly) harmful, so that nothing is hidden.

Only records with a non-finite tensor are walked (one Python loop over them; a clean dump costs
one vectorised filter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchparity.naninf_rule import ABSORBED, ENTERED, HARMFUL, creates_nonfinite_scalar, is_sink

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

Key = tuple[Any, Any, int]  # (step, rank, record_id)
_UNKNOWN: Key = ("?", "?", -1)


@dataclass
class SiteStatus:
    """What the lineage says about one record with a non-finite tensor."""

    status: str | None  # harmful | absorbed (a creation site) | entered | None (carries values on)
    carries: frozenset = frozenset()  # the sites its non-finite tensors carry
    possible: bool = False  # harmful only because the step's lineage is incomplete
    unknown: bool = False  # carries a non-finite value of unknown origin


@dataclass
class _Rec:
    key: Key
    phase: str
    outside: bool
    inplace: bool
    view: bool
    bad_in: list[tuple[Any, tuple, bool]] = field(default_factory=list)  # (producer, signature, is a constant)
    forced: bool = False
    bad_out: list[int] = field(default_factory=list)
    out_meta: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    out_sig: dict[int, tuple] = field(default_factory=dict)  # bad outputs: (shape, dtype, nan, inf)
    in0: Any = None


def _link(p: Any) -> tuple[int, int] | None:
    if isinstance(p, (list, tuple)) and len(p) == 2:
        try:
            return int(p[0]), int(p[1])
        except (TypeError, ValueError):
            return None
    return None


def _flag(flags: Any, name: str) -> bool:
    return isinstance(flags, dict) and bool(flags.get(name))


def _shape(s: Any) -> tuple:
    try:
        return tuple(int(x) for x in s)
    except (TypeError, ValueError):
        return ()


def trace(f: "pd.DataFrame", bad: "pd.Series", judged: "pd.Series", design: set[Key]) -> dict[Key, SiteStatus]:
    """Status of every record with a judged non-finite (or saturated) tensor, by key."""
    import pandas as pd

    is_in = f["io"].isin(["input", "param"])
    is_out = f["io"].eq("output")
    bad_rows = judged & bad & (is_in | is_out)
    # scalar arguments that write NaN (x * nan, fill_(nan)), and lifted 0-d constants holding one
    scal = f["kind"].eq("scalar") & is_in if "kind" in f.columns else pd.Series(False, index=f.index)
    nan_scalar = scal & f["value"].map(creates_nonfinite_scalar) if "value" in f.columns else scal & False
    keys_of = pd.Series(list(zip(f["step"], f["rank"], f["record_id"])), index=f.index)
    cand = set(keys_of[bad_rows]) | set(keys_of[nan_scalar])
    if not cand:
        return {}
    rows = f[keys_of.isin(cand)]
    rkeys = keys_of[rows.index]
    recs: dict[Key, _Rec] = {}
    def count(col: str) -> pd.Series:
        if col not in rows.columns:
            return pd.Series(0.0, index=rows.index)
        return pd.to_numeric(rows[col], errors="coerce").fillna(0.0)

    nan_c, inf_c = count("nan"), count("inf")
    for i, key in zip(rows.index, rkeys):
        r = recs.get(key)
        if r is None:
            flags = rows.at[i, "flags"] if "flags" in rows.columns else None
            module, mclass = rows.at[i, "module"], rows.at[i, "module_class"] if "module_class" in rows.columns else None
            outside = (not isinstance(module, str) or module == "") and not (isinstance(mclass, str) and mclass)
            r = recs[key] = _Rec(key, str(rows.at[i, "phase"]), outside, _flag(flags, "inplace"), _flag(flags, "view"))
        io, arg = rows.at[i, "io"], str(rows.at[i, "arg"])
        prod = _link(rows.at[i, "producer"]) if "producer" in rows.columns else None
        if io == "input" and arg in ("0", "self"):
            r.in0 = prod
        if nan_scalar.at[i]:
            r.forced = True
        if not bad_rows.at[i]:
            if io == "output":
                r.out_meta[_idx(arg)] = (_shape(rows.at[i, "shape"]), rows.at[i, "dtype"])
            continue
        sig = (_shape(rows.at[i, "shape"]), rows.at[i, "dtype"], float(nan_c.at[i]), float(inf_c.at[i]))
        if io == "output":
            r.bad_out.append(_idx(arg))
            r.out_meta[_idx(arg)] = sig[:2]
            r.out_sig[_idx(arg)] = sig
        else:
            const = prod is None and sig[0] == ()
            if const and nan_c.at[i] > 0:
                r.forced = True  # a lifted NaN scalar (``out[..., 3] = nan``)
            r.bad_in.append((prod, sig, const))
    # views (any record, finite or not): output -> its input 0, to find the base a write reaches
    views: dict[tuple[Any, Any], dict[int, int]] = {}
    vflag = f["flags"].map(lambda d: _flag(d, "view")) if "flags" in f.columns else pd.Series(False, index=f.index)
    vrows = f[vflag & f["io"].eq("input") & f["arg"].astype(str).isin(["0", "self"])]
    for s, rk, rid, p in zip(vrows["step"], vrows["rank"], vrows["record_id"], vrows.get("producer", [])):
        link = _link(p)
        if link is not None:
            views.setdefault((s, rk), {})[int(rid)] = link
    consumed: dict[tuple[Any, Any], set[tuple[int, int]]] = {}
    if "producer" in f.columns:
        prow = f[is_in & f["producer"].notna()]
        for s, rk, p in zip(prow["step"], prow["rank"], prow["producer"]):
            link = _link(p)
            if link is not None:
                consumed.setdefault((s, rk), set()).add(link)
    # shape and dtype of the tensors in-place writes reach (their base through views), for readers
    # the dump could not link (the write bumped the version)
    bases: dict[tuple[Any, Any], dict[tuple[int, int], tuple[tuple, Any]]] = {}
    need: set[tuple[Any, Any, int, str]] = set()
    for r in recs.values():
        if r.inplace and r.in0 is not None:
            p, seen, vu = r.in0, 0, views.get(r.key[:2], {})
            need.add((*r.key[:2], p[0], str(p[1])))
            while p[1] == 0 and p[0] in vu and seen < 64:
                p, seen = vu[p[0]], seen + 1
                need.add((*r.key[:2], p[0], str(p[1])))
    if need:
        orow = f[is_out & pd.Series(list(zip(f["step"], f["rank"], f["record_id"], f["arg"].astype(str))),
                                    index=f.index).isin(need)]
        for s, rk, rid, a, shp, dt in zip(orow["step"], orow["rank"], orow["record_id"], orow["arg"].astype(str),
                                          orow["shape"], orow["dtype"]):
            bases.setdefault((s, rk), {})[(int(rid), _idx(a))] = (_shape(shp), dt)
    out: dict[Key, SiteStatus] = {}
    by_unit: dict[tuple[Any, Any], list[_Rec]] = {}
    for r in recs.values():
        by_unit.setdefault(r.key[:2], []).append(r)
    for unit, lst in by_unit.items():
        lst.sort(key=lambda r: r.key[2])
        out.update(_walk(lst, views.get(unit, {}), consumed.get(unit, set()), design, bases.get(unit, {})))
    return out


def _idx(arg: str) -> int:
    try:
        return int(arg)
    except ValueError:
        return 0


def _walk(recs: list["_Rec"], views: dict[int, tuple[int, int]], consumed: set[tuple[int, int]],
          design: set[Key], meta: dict[tuple[int, int], tuple[tuple, Any]]) -> dict[Key, SiteStatus]:
    """One step of one rank: carry sites through the records, in op order."""
    carried: dict[tuple[int, int], frozenset] = {}
    written: dict[tuple[int, int], tuple[int, tuple, Any]] = {}  # base -> (writer rid, shape, dtype)
    meta = dict(meta)
    masks: dict[Key, frozenset] = {}
    sites: list[Key] = []
    harm: set[Key] = set()
    lost = False
    entered: Key | None = None
    sink_keys: set[Key] = set()
    by_sig: dict[tuple, tuple[int, int]] = {}  # (shape, dtype, nan, inf) -> the last bad output with it

    def base(p: tuple[int, int]) -> tuple[int, int]:
        seen = 0
        while p[1] == 0 and p[0] in views and seen < 64:
            p, seen = views[p[0]], seen + 1
        return p

    for r in recs:
        rid = r.key[2]
        for i, m in r.out_meta.items():
            meta[(rid, i)] = m
        mask: set[Key] = set()
        real_bad_in = False
        for prod, sig, const in r.bad_in:
            if const:
                continue  # a scalar constant: a NaN one makes the op a site (forced), an Inf one a mask
            real_bad_in = True
            if prod is not None and prod[0] < rid:
                got = carried.get(prod)
                if got is None:  # the producer's output was finite then: written since (through a view)
                    got = carried.get(base(prod))
                if got is None:
                    mask.add(_UNKNOWN)
                    entered = entered or r.key
                else:
                    mask |= got
                continue
            # No link (a view or alias the dump did not record, a version bumped by a write): the
            # last bad output with the same shape, dtype and NaN/Inf counts, else the base written
            # last with this shape and dtype.
            same = by_sig.get(sig)
            match = max(((w[0], b) for b, w in written.items() if w[1] == sig[0] and w[2] == sig[1] and w[0] < rid),
                        default=None)
            if same is not None and (match is None or same[0] > match[0]):
                mask |= carried.get(same, frozenset())
            elif match is not None:
                mask |= carried.get(match[1], frozenset())
            else:
                mask.add(_UNKNOWN)
                entered = entered or r.key
        is_site = bool(r.bad_out) and (not real_bad_in or r.forced) and r.key not in design
        if is_site:
            mask.add(r.key)
            sites.append(r.key)
        if r.key in design:
            mask = set()
        fm = frozenset(mask)
        masks[r.key] = fm
        for i in r.bad_out:
            carried[(rid, i)] = fm
            by_sig[r.out_sig[i]] = (rid, i)
        if r.inplace and r.bad_out and r.in0 is not None:
            b = base(r.in0)
            for t in {r.in0, b}:
                carried[t] = carried.get(t, frozenset()) | fm
            shape, dtype = meta.get(b, ((), None))
            written[b] = (rid, shape, dtype)
        terminal = (r.phase == "forward" and not r.inplace and not r.view
                    and any((rid, i) not in consumed for i in r.bad_out))
        if r.bad_out and (is_sink(r.phase, r.outside) or terminal):
            sink_keys.add(r.key)
            harm |= fm
            if _UNKNOWN in fm:
                lost = True
    res: dict[Key, SiteStatus] = {}
    harmful = {k for k in sites if k in harm}
    for r in recs:
        fm = masks[r.key]
        unknown = _UNKNOWN in fm
        if r.key in sites:
            possible = lost and r.key not in harmful
            status = HARMFUL if (r.key in harmful or possible) else ABSORBED
            res[r.key] = SiteStatus(status, fm - {_UNKNOWN}, possible, unknown)
        elif lost and r.key == entered:
            res[r.key] = SiteStatus(ENTERED, fm - {_UNKNOWN}, False, True)
        else:
            res[r.key] = SiteStatus(None, fm - {_UNKNOWN}, False, unknown)
    return res
