"""torchparity checker ``md5``: checksum equality for md5-mode dumps.

Rows whose two sides carry an MD5 of the raw tensor bytes are judged:

* ``pass``: equal checksums (bit-identical tensors);
* ``error``: an output checksum differs while every input of the same op is bit-identical
  (the op introduced the difference);
* ``warning``: a checksum differs on an input, or on an output whose inputs already differ, or
  only one side has a checksum;
* ``skip``: no checksums, or different dtypes (bf16 and fp32 bytes never match: judge those with
  ``allclose``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchparity import hookimpl
from torchparity.plugin_types import CheckContext, Checker

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__version__ = "0.1.0"


class Md5Checker(Checker):
    """Bit-exactness of tensors through their checksums."""

    name = "md5"
    scopes = frozenset({"compare"})
    description = "checksum equality (md5 mode): first op whose output bytes differ with identical inputs"

    def judge_rows(self, rows: pd.DataFrame, ctx: CheckContext | None = None) -> pd.DataFrame:
        import numpy as np
        import pandas as pd

        n = len(rows)
        verdict = np.full(n, "skip", dtype=object)
        reason = np.full(n, "", dtype=object)
        if "device_md5" not in rows.columns or "bench_md5" not in rows.columns:
            return _verdicts(verdict, reason, rows.index)
        dm, bm = rows["device_md5"], rows["bench_md5"]
        matched = (rows["match"] != "unmatched").to_numpy() if "match" in rows else np.ones(n, bool)
        both = (dm.notna() & bm.notna()).to_numpy() & matched
        one = (dm.notna() ^ bm.notna()).to_numpy() & matched
        if not (both.any() or one.any()):  # no checksums (statistics/tensor dumps): nothing to judge
            return _verdicts(verdict, reason, rows.index)
        same_dtype = (rows["device_dtype"] == rows["bench_dtype"]).to_numpy() if "device_dtype" in rows else np.ones(n, bool)
        equal = (dm == bm).to_numpy()
        io = rows["io"].astype(str).to_numpy() if "io" in rows else np.full(n, "output")
        out_like = np.isin(io, ["output", "grad"])
        # inputs identical per record: every input row with checksums has equal checksums
        rid = rows["device_record_id"].to_numpy() if "device_record_id" in rows else np.arange(n)
        key = pd.Series(list(zip(rows["step"], rows["rank"], rid))) if {"step", "rank"} <= set(rows.columns) else pd.Series(rid)
        tensor_in = ~out_like & matched & ((rows["kind"] == "tensor").to_numpy() if "kind" in rows else True)
        in_bad = pd.Series(tensor_in & ~(both & same_dtype & equal)).groupby(key.to_numpy()).transform("max").to_numpy(dtype=bool)
        ok = both & same_dtype
        verdict[ok & equal] = "pass"
        diff = ok & ~equal
        err = diff & out_like & ~in_bad
        verdict[err] = "error"
        reason[err] = "checksum differs while the op's inputs are bit-identical: introduced here"
        warn = diff & ~err
        verdict[warn] = "warning"
        reason[warn] = np.where(out_like[warn], "checksum differs (its inputs differ too)", "input checksum differs")
        verdict[one] = "warning"
        reason[one] = "checksum present on one side only"
        skip_dt = both & ~same_dtype
        reason[skip_dt] = "different dtypes: checksums are not comparable"
        return _verdicts(verdict, reason, rows.index)


def _verdicts(verdict: Any, reason: Any, index: Any) -> Any:
    """The checker's answer: ``verdict``/``reason`` object columns (pandas >= 3 would infer its
    slower ``str`` dtype from object arrays of strings)."""
    import pandas as pd

    return pd.DataFrame({"verdict": pd.Series(verdict, index=index, dtype=object),
                         "reason": pd.Series(reason, index=index, dtype=object)})


@hookimpl
def torchparity_checkers():
    yield Md5Checker()
