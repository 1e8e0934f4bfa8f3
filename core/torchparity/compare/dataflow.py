"""The data flow between the device records of one (step, rank), as positions.

``rootcause`` and ``hidden_flips`` walk it in execution order (an error carried from record to
record); this builds the edges once, in the form both need."""

from __future__ import annotations

from typing import Any

import numpy as np


def record_edges(r: Any, is_in: Any, rec_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(consumer, producer)`` positions in ``rec_ids`` of every input row linked to its producer
    (``r``: device rows with ``rid`` and ``p_rid``), sorted by consumer (for ``np.searchsorted``)."""
    import pandas as pd

    pos = pd.Series(np.arange(len(rec_ids)), index=rec_ids)
    edge = is_in.to_numpy() & (r["p_rid"].to_numpy() >= 0)
    cons = pos.reindex(r["rid"].to_numpy()[edge]).to_numpy()
    prod = pos.reindex(r["p_rid"].to_numpy()[edge]).to_numpy()
    ok = ~np.isnan(cons) & ~np.isnan(prod)
    cons, prod = cons[ok].astype(np.int64), prod[ok].astype(np.int64)
    by = np.argsort(cons, kind="stable")
    return cons[by], prod[by]
