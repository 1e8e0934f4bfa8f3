"""Graded node colours: a precision index in [0, 1] per node and the colour band it falls in.

The index follows msprobe's hierarchical graph compare (seed 003, section 6.1):

- **statistics** mode: the relative error of the outputs estimated from their statistics, capped
  at 1: compare's ``error`` column (relative norm difference, mean difference scaled by the norm,
  extremes relative to the largest magnitude). msprobe takes ``|device - bench| / |bench|`` of each
  statistic instead; that explodes whenever a mean is close to 0 (most ops downstream of any
  change then show the deepest colour), so the raw relative differences are only the fallback
  for rows without an ``error``;
- **tensor** mode: how much the 1‰ ratio (share of elements within 1/1000 relative error) drops
  from the inputs to the outputs: ``min(inputs' ratio) - min(outputs' ratio)``, at least 0
  (``1 - min(outputs' ratio)`` for an op without compared inputs);
- **md5** mode: 1 when any output checksum differs, else 0;
- a device output holding more NaN or Inf than the bench output: 1 (the deepest colour) whatever
  the mode (msprobe: any NaN/Inf on the device side; an attention mask's ``-inf``, present on
  both sides, would then paint every attention block the deepest colour).

The larger the index, the deeper the colour. Nodes not compared (one side only, nothing judged)
have no index (``None``): grey when unmatched, white otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

#: default upper bounds of the bands below 1 (5 bands: [0,.2) [.2,.4) [.4,.6) [.6,.8) [.8,1])
DEFAULT_BANDS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
#: light to deep, one colour per band (msprobe-like yellow to red ramp)
BAND_COLOURS: tuple[str, ...] = ("#FFFCF3", "#FFEDBE", "#FFDC7F", "#FFC62E", "#FF704D")
UNMATCHED_COLOUR = "#C7C7C7"
NONE_COLOUR = "#FFFFFF"
STAT_REL = ("max_rel_diff", "min_rel_diff", "mean_rel_diff", "norm_rel_diff")


@dataclass(frozen=True)
class Band:
    """One legend entry: the colour of indices in ``[low, high)`` (the last band includes 1)."""

    low: float
    high: float
    colour: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_bands(bands: Sequence[float] | None) -> tuple[float, ...]:
    """Validated band bounds: strictly increasing finite numbers strictly between 0 and 1, at most
    four (five colours). ``None`` gives :data:`DEFAULT_BANDS`. Raises ``ValueError``."""
    if bands is None:
        return DEFAULT_BANDS
    out = []
    for b in bands:
        try:
            v = float(b)
        except (TypeError, ValueError):
            raise ValueError(f"band bound {b!r} is not a number") from None
        if not (math.isfinite(v) and 0.0 < v < 1.0):
            raise ValueError(f"band bound {b!r} must be a number strictly between 0 and 1")
        out.append(v)
    if not out or len(out) > len(BAND_COLOURS) - 1:
        raise ValueError(f"give 1 to {len(BAND_COLOURS) - 1} band bounds, got {len(out)}")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"band bounds must increase strictly, got {','.join(f'{v:g}' for v in out)}")
    return tuple(out)


def legend(bands: Sequence[float] | None = None) -> list[Band]:
    """The legend of ``bands``: deeper colours for larger indices (the ramp's deep end is kept)."""
    b = check_bands(bands)
    colours = BAND_COLOURS[len(BAND_COLOURS) - len(b) - 1:]
    edges = (0.0, *b, 1.0)
    return [Band(edges[i], edges[i + 1], colours[i]) for i in range(len(b) + 1)]


def band_of(index: float | None, bands: Sequence[float] | None = None) -> int | None:
    """The band number (0 = lightest) of a precision index; ``None`` for no index."""
    if index is None or not isinstance(index, (int, float)) or math.isnan(index):
        return None
    b = check_bands(bands)
    return sum(1 for edge in b if index >= edge)


def _num(x: Any) -> float | None:
    if x in ("Infinity", "-Infinity"):  # graph dicts are strict JSON: infinities are strings
        return math.inf if x == "Infinity" else -math.inf
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return None if math.isnan(v) else v


def precision_index(metrics: Iterable[dict[str, Any]], mode: str | None = None) -> float | None:
    """The precision index of one record from its compare rows (``Node.metrics`` entries), or
    ``None`` when none of its outputs was compared."""
    rows = [m for m in metrics if isinstance(m, dict)]
    outs = [m for m in rows if m.get("io") == "output" and m.get("match", "exact") != "unmatched"]
    if not outs:
        return None
    if any((_num(m.get(f"device_{k}")) or 0) > (_num(m.get(f"bench_{k}")) or 0) for m in outs for k in ("nan", "inf")):
        return 1.0
    if mode == "md5" or (mode is None and any("md5_equal" in m for m in outs)):
        eq = [m.get("md5_equal") for m in outs if m.get("md5_equal") is not None]
        return (0.0 if all(eq) else 1.0) if eq else None
    ratios_out = [v for v in (_num(m.get("one_thousandth_ratio")) for m in outs) if v is not None]
    if ratios_out and mode in (None, "tensor"):
        ins = [v for v in (_num(m.get("one_thousandth_ratio")) for m in rows if m.get("io") == "input")
               if v is not None]
        drop = (min(ins) if ins else 1.0) - min(ratios_out)
        return min(1.0, max(0.0, drop))
    errs = [v for v in (_num(m.get("error")) for m in outs) if v is not None]
    rel = errs or [v for m in outs for v in (_num(m.get(c)) for c in STAT_REL) if v is not None]
    if not rel:
        return None
    worst = max(abs(v) for v in rel)
    return 1.0 if math.isinf(worst) or worst > 1.0 else max(0.0, worst)
