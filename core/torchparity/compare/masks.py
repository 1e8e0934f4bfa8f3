"""Products with a mask both runs share (dropout's scaled 0/s mask): their aggregate channel is not
scored (docs/judge-calibration.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import error_model

_MASK_PRODUCTS = frozenset({"mul", "mul_"})


def mask_products(rows: Any, dev: np.ndarray, r: Any, is_in: Any, recs: Any, fam: np.ndarray) -> np.ndarray:
    """Per record: a ``mul`` one of whose tensor inputs is a scaled mask both runs share (identical:
    error 0; min 0 and max > 1 on both sides, as dropout's ``bernoulli / (1 - p)``) while another input
    differs. Found by a new-user check on a clean T5 in bf16 against fp32 (session 15): its
    attention dropout's product was blamed, amplified 14.7x, because the softmax rows' exact sums
    (an exact mean) stop holding on the masked subset. Only its aggregate channel is left out: a
    fault in such a product (a padding mask's, x1.05) still shows in its extreme channel."""
    import pandas as pd

    rec_ids = recs.index.to_numpy()
    out = np.zeros(len(rec_ids), dtype=bool)
    if "device_min" not in rows or "bench_min" not in rows:
        return out
    ops = recs["op"].to_numpy(dtype=object)
    is_mul = {o: error_model.op_stem(o) in _MASK_PRODUCTS for o in pd.unique(ops)}  # one decision per name
    cand = np.fromiter((is_mul[o] for o in ops), dtype=bool, count=len(ops)) & (fam == "elementwise")
    if not cand.any():
        return out
    dmin = pd.to_numeric(rows["device_min"], errors="coerce").to_numpy(dtype="float64")[dev]
    bmin = pd.to_numeric(rows["bench_min"], errors="coerce").to_numpy(dtype="float64")[dev]
    dmax = pd.to_numeric(rows["device_max"], errors="coerce").to_numpy(dtype="float64")[dev]
    bmax = pd.to_numeric(rows["bench_max"], errors="coerce").to_numpy(dtype="float64")[dev]
    err = r["err"].to_numpy(dtype="float64")
    inp = is_in.to_numpy()
    # a scaled mask (dropout's 1/(1-p) > 1): a 0/1 padding mask keeps its product fully judged
    mask_in = inp & r["matched"].to_numpy() & (err == 0) & (dmin == 0) & (bmin == 0) & (dmax > 1) & (bmax > 1)
    other = inp & (np.nan_to_num(err, nan=0.0) > 0)
    g = pd.DataFrame({"rid": r["rid"].to_numpy(), "m": mask_in, "o": other}).groupby("rid")[["m", "o"]].any()
    g = g.reindex(rec_ids).fillna(False)
    return cand & g["m"].to_numpy(dtype=bool) & g["o"].to_numpy(dtype=bool)
