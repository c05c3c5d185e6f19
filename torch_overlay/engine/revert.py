"""Undo what can be undone in this process: swapped code; patched module code needs a new process."""

from __future__ import annotations

from collections.abc import Iterable

from .._state import PatchState
from .components import Component

__all__ = ["revert_components"]


def revert_components(components: Iterable[Component]) -> tuple[list[str], list[str]]:
    """Restore swapped code; return (modules whose code changed, one line per patch needing a restart).

    A module that executed its patched source at import keeps it (its functions were never
    anything else); its component stays as it is, so that a multi-file patch is never left half
    applied.
    """
    touched: list[str] = []
    needs_restart: list[str] = []
    for component in components:
        if any(e.at_import for e in component.entries):
            for entry in component.entries:
                if entry.state in (PatchState.APPLIED, PatchState.PENDING) and entry.changes:
                    needs_restart.append(
                        f"{entry.id}: applied at import of {', '.join(sorted(entry.changes))}; "
                        f"start a new process with TORCH_OVERLAY_DISABLE={entry.id} to run without it"
                    )
            continue
        component.reverted = True
        for entry in reversed(component.entries):
            for plan in reversed(entry.plans):
                plan.revert()
                touched.append(plan.module.__name__)
            entry.plans, entry.swapped = (), frozenset()
            if entry.state in (PatchState.APPLIED, PatchState.PENDING):
                entry.state, entry.reason = PatchState.DISABLED, "reverted by torch_overlay.revert()"
    return touched, needs_restart
