"""The tiers of a scheduled dump (``every=N`` / ``steps=[...]`` with ``light="module"``).

A scheduled dump says in each step's ``header.json`` what that step recorded: ``"tier": "full"``
(the configured level and mode) or ``"tier": "light"`` (module records, statistics; ``level`` and
``mode`` say so too). A dump without a schedule has no ``tier``: every step is full. Comparing two
dumps pairs only steps recorded alike (:func:`like_pairs`); a full step facing a light one has
nothing in common to compare and is left out with a warning, never reported as a pass.
"""

from __future__ import annotations

from typing import Any


def step_tier(header: dict[str, Any] | None) -> str:
    """``"full"`` or ``"light"``: what a (step, rank) header says its step recorded."""
    tier = (header or {}).get("tier")
    return tier if tier in ("full", "light") else "full"


def like_pairs(dev: Any, ben: Any, common: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[str]]:
    """The (step, rank) pairs of ``common`` whose two sides were recorded alike (same tier, or
    module records on both sides), and a warning for each pair left out.

    :param dev: the device dump's reader; :param ben: the bench dump's reader (``header(step, rank)``).
    """
    kept: list[tuple[int, int]] = []
    warnings: list[str] = []
    for s, r in common:
        hd, hb = dev.header(s, r) or {}, ben.header(s, r) or {}
        td, tb = step_tier(hd), step_tier(hb)
        if td == tb or (hd.get("level") == "module" and hb.get("level") == "module"):
            kept.append((s, r))
            continue
        warnings.append(f"step{s}/rank{r} was captured fully ({(hd if td == 'full' else hb).get('level')} level) "
                        f"on the {'device' if td == 'full' else 'bench'} side and light (module records) on the "
                        f"{'bench' if td == 'full' else 'device'} side: not compared; dump both sides with the "
                        f"same steps/every")
    return kept, warnings
