"""Every patch of the series in this process, as entries in series order.

A recalled activation (:mod:`.activation_memo`) makes the entries of the patches it settled at
once, and those of a component only when the component is first used: decided, reverted, or
listed by ``status``. Until then each of its members is pending, waiting for the import of its
modules, which is all a job's lines need to know of it: a warm import makes no entry for the
patches of the modules it never imports, however long the series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .components import Component, Entry

__all__ = ["Roster"]


class Roster:
    def __init__(self, ids: list[str], slots: list[Entry | None], components: list[Component]) -> None:
        self.ids = ids  # the series' patch ids, in order
        # Each position's entry; None until its component makes its members (Component.entries
        # fills the slot).
        self._slots = slots
        self.components = components

    @classmethod
    def of(cls, entries: list[Entry], components: list[Component]) -> Roster:
        """A roster whose entries are all made."""
        return cls([e.id for e in entries], list(entries), components)

    def every(self) -> list[Entry]:
        """Every entry, in series order (the members of each component are made now)."""
        if None in self._slots:
            for component in self.components:
                component.entries  # noqa: B018 - makes its members, which fill their slots
        return list(self._slots)  # type: ignore[arg-type]

    def made(self) -> list[Entry]:
        """The entries made so far, in series order: every one that may have a state other than
        pending or have changed code."""
        return [e for e in self._slots if e is not None]

    def unmade(self) -> int:
        """How many patches have no entry yet: each is pending, its modules not imported."""
        return self._slots.count(None)
