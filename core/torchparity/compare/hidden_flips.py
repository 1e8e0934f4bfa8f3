"""Elementwise error that a threshold's backward hides from the statistics.

A ReLU's backward passes the gradient where its input was positive and zeroes it elsewhere. When
the two runs' inputs differ (a bf16 or fp16 run against fp32), the elements within that error of
zero fall on different sides: there one run passes a full-size gradient element and the other a
zero. That is a sparse error of a few percent of the gradient's norm (a clean T5 under fp16
autocast: 0.75% before its encoder ReLU's backward, 5.4% after, from a tensor dump) which moves
neither the gradient's max, nor its min, nor its norm: the statistics of every tensor downstream
look clean, until an op sums over the flipped elements (a bmm over the queries, a weight gradient
over the batch) and its largest element moves by that much. That op introduced nothing.

Size of the hidden error, from what the statistics do show: with the input's relative error
``e`` (its largest element's), the inputs within ``e * max|x|`` of zero flip, a fraction of about
``FLIP_FACTOR * e`` of a bell-shaped activation (density ``1/(sigma sqrt(2 pi))`` at zero, ``max|x|``
about 4 sigma); the gradient at those elements is of typical size, so the error vector's norm is
``sqrt(FLIP_FACTOR * e)`` of the gradient's norm (T5: ``e`` = 5.9e-4 gives 4.3%, measured 5.4%).

Every backward record reading a gradient downstream of such a threshold has its extreme channel
measured against that hidden error too (``rootcause``), and its aggregate channel against
:data:`HIDDEN_TO_NORM` of it (a x1.05 fault moves a norm by 5%, while sparse flips move it by a
small share of their size), so a scale fault downstream is still found.

The hidden error grows like the square root of the rounding (fp16 ~4%, bf16 ~18%), while the
visible input errors grow like the rounding itself: that is why fp16 runs showed it and bf16 runs,
judged against 8x larger visible errors, did not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import error_model
from .dataflow import record_edges

#: ops whose backward zeroes the gradient by comparing the forward input with a threshold (or picks
#: the largest element of a window), by aten, api and module name
THRESHOLDS = frozenset({"threshold_backward", "relu", "relu_", "relu6", "threshold", "threshold_",
                        "hardtanh", "hardtanh_", "hardtanh_backward", "leaky_relu", "leaky_relu_",
                        "leaky_relu_backward", "max_pool1d", "max_pool2d", "max_pool3d",
                        "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
                        "max_pool3d_with_indices", "max_pool3d_with_indices_backward",
                        "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool2d_backward",
                        "adaptive_max_pool3d", "adaptive_max_pool3d_backward",
                        "ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "Threshold", "MaxPool1d", "MaxPool2d",
                        "MaxPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d"})
#: flipped fraction per unit of relative input error (module docstring)
FLIP_FACTOR = 3.2
#: the share of the hidden error an output's norm may carry without counting as amplified: a sum
#: over flipped elements (a weight gradient over the batch) moves its norm by a few percent of the
#: hidden error (clean T5 under fp16 autocast: an ``mm`` weight gradient 0.2% for a hidden 4%),
#: while a x1.05 fault moves it by 5% (bf16 T5, hidden ~18%: 0.05 / (0.01 * 0.18) = 28)
HIDDEN_TO_NORM = 0.01


def hidden_inputs(recs: Any, r: Any, is_in: Any, i_err: np.ndarray) -> np.ndarray:
    """Per record (``recs`` order): the hidden elementwise error of the gradients it reads, carried
    from every threshold backward upstream of it through the data flow (0 where none).

    ``r``: device rows with ``rid`` and ``p_rid`` (producer record, -1 for none); ``i_err``: each
    record's input error (the largest of its inputs, including what a backward record reads from
    its forward op)."""
    import pandas as pd

    rec_ids = recs.index.to_numpy()
    n = len(rec_ids)
    out = np.zeros(n)
    if not n or "phase" not in recs or "op" not in recs:
        return out
    thr = error_model.stems_in(recs["op"].to_numpy(dtype=object), THRESHOLDS) \
        & (recs["phase"].to_numpy(dtype=object) == "backward")
    if not thr.any():
        return out
    with np.errstate(invalid="ignore"):
        src = np.where(thr, np.sqrt(FLIP_FACTOR * np.clip(np.nan_to_num(i_err, nan=0.0, posinf=0.0), 0.0, None)), 0.0)
    cons, prod = record_edges(r, is_in, rec_ids)
    order = pd.to_numeric(recs["order"], errors="coerce").to_numpy(dtype="float64") if "order" in recs \
        else np.arange(n, dtype="float64")
    first = np.nanmin(np.where(thr, order, np.nan))
    # only records after the first threshold can read its gradient; walk them in execution order
    walk = np.flatnonzero(order >= first)
    walk = walk[np.argsort(order[walk], kind="stable")]
    keep = np.isin(cons, walk)
    cons, prod = cons[keep], prod[keep]  # still sorted by consumer
    starts = np.searchsorted(cons, walk, side="left")
    ends = np.searchsorted(cons, walk, side="right")
    h_out = src.copy()
    bwd = recs["phase"].to_numpy(dtype=object) == "backward"
    running = 0.0  # the largest hidden error a threshold made so far (for records without data-flow links)
    for k, a, b in zip(walk.tolist(), starts.tolist(), ends.tolist()):
        # through the data flow where the record's inputs are linked to their producers (aten
        # level); else (api and module levels link no backward inputs) from every threshold that
        # ran before it in the backward pass: the gradient it reads has passed through them or
        # been summed with one that did (a residual add)
        h = float(h_out[prod[a:b]].max()) if b > a else (running if bwd[k] else 0.0)
        if h > 0.0:
            out[k] = h
            if h > h_out[k]:
                h_out[k] = h
        if thr[k] and src[k] > running:
            running = float(src[k])
    return out
