"""Keep a quick ``verify`` (the demo) inside a time budget however long the series grows.

The quick reproducers run in two pytest processes at once (without and with the overlay), so the
wall time is about the start-up plus the longer side's sum. With the times the last run measured
(:mod:`.timings`), the fastest reproducers are kept while the longer side fits the budget; a fix
never measured is always kept (its first run measures it). Those left out are named, and
``verify`` without ``--budget`` runs them.
"""

from __future__ import annotations

from ..series.series import Patch
from .timings import Timings

__all__ = ["STARTUP_S", "within_budget"]

# What a pytest process takes before its first test (torch, the overlay, collection): 2 idle cores.
STARTUP_S = 12.0


def within_budget(patches: list[Patch], timings: Timings, budget: float) -> tuple[list[Patch], list[Patch]]:
    """(kept, left out): ``patches`` in series order, the slowest left out to fit ``budget`` seconds."""
    known: dict[str, tuple[float, float]] = {}
    for patch in patches:
        without, with_ = timings.get(f"{patch.id} without"), timings.get(f"{patch.id} with")
        if without is not None and with_ is not None:
            known[patch.id] = (without, with_)
    keep = {p.id for p in patches if p.id not in known}  # never measured: kept, measured now
    sums = [0.0, 0.0]  # the seconds kept so far, without and with the overlay
    for pid, (without, with_) in sorted(known.items(), key=lambda kv: (max(kv[1]), kv[0])):
        if STARTUP_S + max(sums[0] + without, sums[1] + with_) > budget:
            break
        sums = [sums[0] + without, sums[1] + with_]
        keep.add(pid)
    return [p for p in patches if p.id in keep], [p for p in patches if p.id not in keep]
