"""What deciding a component gives each of its entries: the decider makes it, the decision cache
keeps it and gives it back to a later process."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._state import PatchState
from ..series.patchfile import PatchFile

__all__ = ["Outcome"]


@dataclass
class Outcome:
    """What the decision gives one entry (APPLIED: the torch-relative paths its variant changes)."""

    state: PatchState
    reason: str
    variant: PatchFile | None
    paths: set[str] = field(default_factory=set)
