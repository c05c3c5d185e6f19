"""What deciding a component gives each of its entries: the decider makes it, the decision cache
keeps it and gives it back to a later process."""

from __future__ import annotations

from .._state import PatchState
from ..series.patchfile import PatchFile

__all__ = ["Outcome"]


class Outcome:
    """What the decision gives one entry (APPLIED: the torch-relative paths its variant changes;
    ``late``: the module imported before the overlay that cost it the fix, or "")."""

    def __init__(
        self,
        state: PatchState,
        reason: str,
        variant: PatchFile | None,
        paths: set[str] | None = None,
        late: str = "",
    ) -> None:
        self.state = state
        self.reason = reason
        self.variant = variant
        self.paths: set[str] = set() if paths is None else paths
        self.late = late

    def __repr__(self) -> str:
        late = f", late={self.late!r}" if self.late else ""
        return f"Outcome({self.state!r}, {self.reason!r}, paths={sorted(self.paths)}{late})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        mine = (self.state, self.reason, self.variant, self.paths, self.late)
        return mine == (other.state, other.reason, other.variant, other.paths, other.late)

    __hash__ = None  # type: ignore[assignment]
