"""Whose fault it is when a module's patched code raises: the patch's, or torch's own import's.

The import hook then runs the module's own code (:mod:`.importhook`). If that runs, the patch is at
fault: it fails, with a warning. If it raises too, torch's own import failed (torch 2.13's circular
import of ``_aot_autograd.runtime_wrappers`` imported first on its own): no patch is blamed; they
stay pending and apply at the module's next import.
"""

from __future__ import annotations

from collections.abc import Callable

from .components import Component, Entry

__all__ = ["FailedImports"]


class FailedImports:
    def __init__(self, fail: Callable[[Entry, str], None]) -> None:
        self._fail = fail  # marks an entry FAILED with a reason (and warns)
        self._raised: dict[str, str] = {}  # module -> what its patched code raised, until its own code ran

    def patched_code_raised(self, component: Component | None, name: str, exc: BaseException, retry: bool) -> None:
        """Module ``name``'s patched code raised ``exc``; ``retry``: its own code runs next."""
        plan = component.modules.get(name) if component else None
        if component is None or plan is None:
            return
        raised = f"{type(exc).__name__}: {exc}"
        if not retry:
            self._fail_plan(component, name, raised)
            return
        self._raised[name] = raised
        for entry in plan.entries:  # what stays if torch's own code raises too
            entry.reason = (
                f"torch's own import of {name} failed ({raised}), without the patch too; "
                f"the patch applies at its next import"
            )

    def new_try(self, name: str) -> None:
        """Module ``name`` is imported again: an earlier failure was torch's own."""
        self._raised.pop(name, None)

    def own_code_ran(self, component: Component, name: str) -> bool:
        """Module ``name`` ran; True when that was its own code after the patched code raised (the patch failed)."""
        raised = self._raised.pop(name, None)
        if raised is not None:
            self._fail_plan(component, name, raised)
        return raised is not None

    def _fail_plan(self, component: Component, name: str, raised: str) -> None:
        plan = component.modules.pop(name, None)
        for entry in plan.entries if plan else []:
            self._fail(entry, f"the patched module raised {raised}")
