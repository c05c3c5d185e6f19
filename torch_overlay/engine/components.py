"""Group the patches the installed torch may need into components: patches that share a file.

A component is decided as one (see :mod:`.decider`), so a file is always patched by every one of
its patches in series order, as ``apply`` does on a checkout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._state import PatchState, Target
from ..series.decide import decide, fitting_variants
from ..series.patchfile import PatchFile
from ..series.series import Patch
from ..series.versions import find_file

if TYPE_CHECKING:
    from .codeswap import SwapPlan
    from .modcode import ModuleCode

__all__ = ["Component", "Entry", "group_components", "ModulePlan"]


@dataclass(eq=False)
class Entry:
    """One patch in this process: its state and what it changed."""

    patch: Patch
    state: PatchState = PatchState.PENDING
    reason: str = ""
    variant: PatchFile | None = None
    component: Component | None = None
    plans: list[SwapPlan] = field(default_factory=list)  # late path: committed swaps
    swapped: set[str] = field(default_factory=set)  # modules whose functions were swapped
    at_import: set[str] = field(default_factory=set)  # modules that executed the patched source
    changes: set[str] = field(default_factory=set)  # modules this patch's variant changes
    # The files of the variants written for this torch whose files all exist in it
    targets: list[Target] = field(default_factory=list)
    warned: bool = False

    @property
    def live(self) -> bool:
        return bool(self.swapped or self.at_import)


@dataclass
class ModulePlan:
    """What a module not yet imported at the decision runs when it is."""

    target: Target
    file: Path
    signature: tuple[int, int, int]  # the file's (size, mtime, inode) when the component was decided
    steps: list[tuple[str, str]] = field(default_factory=list)  # (patch id, text after it)
    entries: list[Entry] = field(default_factory=list)
    code: ModuleCode | None = None
    code_key: str = ""  # a recalled decision: the code cache entry loaded when the module is imported
    known_base: str | None = None  # the file's text, when the decision read it

    @property
    def base(self) -> str:
        """The file's text when the component was decided (read now for a recalled decision)."""
        if self.known_base is None:
            self.known_base = self.file.read_text(encoding="utf-8")
        return self.known_base


@dataclass(eq=False)
class Component:
    entries: list[Entry]
    files: dict[str, Path]  # torch-relative path -> file
    targets: dict[str, Target]  # path -> target
    decided: bool = False
    modules: dict[str, ModulePlan] = field(default_factory=dict)  # module name -> plan
    texts: dict[str, str] = field(default_factory=dict)  # path -> text its module runs (swapped or planned)
    reverted: bool = False
    remembered: bool = False  # recalled from the decision cache: ``texts`` and plans' code come on demand


def group_components(
    entries: list[Entry], version: str, settle: Callable[[Entry, PatchState, str], None]
) -> list[Component]:
    """The components of the pending ``entries``, in series order.

    A patch keeps the variants written for torch ``version`` whose files all exist in it; with
    none, ``settle`` gives it its final state (``failed``, or ``drift`` when no variant is written
    for this torch).
    """
    active = [e for e in entries if e.state == PatchState.PENDING]
    files: dict[str, Path | None] = {}
    for entry in active:
        fitting = [v for v in fitting_variants(entry.patch, version) if v.python_paths]
        if not fitting:  # none written for this torch, or only C++ hunks: settled without a file
            decision = decide(entry.patch, version, {}, python_only=True)
            settle(entry, decision.state, decision.reason)
            continue
        for variant in fitting:
            for path in variant.python_paths:
                if path not in files:
                    files[path] = find_file(path, Target.from_path(path).module)
        present = [v for v in fitting if all(files[p] is not None for p in v.python_paths)]
        entry.targets = list(dict.fromkeys(Target.from_path(p) for v in present for p in v.python_paths))
        if not present:
            missing = sorted({p for v in fitting for p in v.python_paths if files[p] is None})
            settle(entry, PatchState.FAILED, f"{', '.join(missing)} not found in the installed torch")
    active = [e for e in active if e.state == PatchState.PENDING]
    # Union of entries that share a path.
    groups: dict[str, list[Entry]] = {}
    for entry in active:
        merged = [entry]
        for target in entry.targets:
            other = groups.get(target.path)
            if other is not None and other is not merged:
                merged = [e for e in other if e not in merged] + merged
        for e in merged:
            for target in e.targets:
                groups[target.path] = merged
    components = []
    for group in {id(g): g for g in groups.values()}.values():
        ordered = [e for e in entries if e in group]
        targets = {t.path: t for e in ordered for t in e.targets}
        component = Component(ordered, {p: files[p] for p in targets}, targets)  # type: ignore[misc]
        for entry in ordered:
            entry.component = component
            entry.reason = "waiting for import of " + ", ".join(t.module for t in entry.targets)
        components.append(component)
    return components
