"""Group the patches the installed torch may need into components: patches that share a file.

A component is decided as one (see :mod:`.decider`), so a file is always patched by every one of
its patches in series order, as ``apply`` does on a checkout. The records are plain classes, not
dataclasses (see ``_state``'s docstring: this module is imported with every ``import torch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING

from .._state import PatchState, Target
from ..series.patchfile import PatchFile
from ..series.series import Patch
from ..series.versions import find_file

if TYPE_CHECKING:
    from .codeswap import SwapPlan
    from .modcode import ModuleCode

__all__ = ["Component", "Entry", "group_components", "ModulePlan"]


_NONE: frozenset[str] = frozenset()


def _made(pid: str) -> Patch:
    raise AssertionError(f"the entry of {pid} was made with its patch")  # Entry.of sets it


class Entry:
    """One patch in this process: its state and what it changed (compared by identity)."""

    # One per patch at every import: no instance dict (fewer objects for the collector to walk).
    __slots__ = (
        "id",
        "_patch",
        "_source",
        "state",
        "reason",
        "late",
        "variant",
        "component",
        "plans",
        "swapped",
        "at_import",
        "changes",
        "targets",
        "warned",
    )

    def __init__(self, pid: str, source: Callable[[str], Patch]) -> None:
        # The patch's id, and where to get the patch when it is first needed (a recalled activation
        # makes no patch until a component of it is decided: engine/caches/activation_memo.py).
        self.id = pid
        self._patch: Patch | None = None
        self._source = source
        self.state = PatchState.PENDING
        self.reason = ""
        self.late = ""  # FAILED because this module was imported before the overlay, or ""
        self.variant: PatchFile | None = None
        self.component: Component | None = None
        # Immutable until set: an entry is made per patch at every import, and a container each
        # would be objects more per patch for the garbage collector to walk during `import torch`.
        self.plans: tuple[SwapPlan, ...] = ()  # late path: committed swaps
        self.swapped: AbstractSet[str] = _NONE  # modules whose functions were swapped
        self.at_import: AbstractSet[str] = _NONE  # modules that executed the patched source
        self.changes: AbstractSet[str] = _NONE  # modules this patch's variant changes
        # The files of the variants written for this torch whose files all exist in it
        self.targets: Sequence[Target] = ()
        self.warned = False

    @classmethod
    def of(cls, patch: Patch) -> Entry:
        """The entry of a patch already made."""
        entry = cls(patch.id, _made)
        entry._patch = patch
        return entry

    def __repr__(self) -> str:
        return f"Entry({self.id!r}, state={self.state!r}, reason={self.reason!r})"

    @property
    def patch(self) -> Patch:
        """The patch (its variants made when first used)."""
        if self._patch is None:
            self._patch = self._source(self.id)
        return self._patch

    @property
    def live(self) -> bool:
        return bool(self.swapped or self.at_import)


class ModulePlan:
    """What a module not yet imported at the decision runs when it is."""

    def __init__(
        self,
        target: Target,
        file: Path,
        signature: tuple[int, int, int, int],  # the file's (size, mtime, inode, ctime) when the component was decided
        steps: list[tuple[str, str]] | None = None,  # (patch id, text after it)
        entries: list[Entry] | None = None,
        code: ModuleCode | None = None,
        code_key: str = "",  # a recalled decision: the code cache entry loaded when the module is imported
        known_base: str | None = None,  # the file's text, when the decision read it
    ) -> None:
        self.target = target
        self.file = file
        self.signature = signature
        self.steps = [] if steps is None else steps
        self.entries = [] if entries is None else entries
        self.code = code
        self.code_key = code_key
        self.known_base = known_base

    def __repr__(self) -> str:
        return f"ModulePlan({self.target!r}, {str(self.file)!r}, steps={[pid for pid, _ in self.steps]})"

    @property
    def base(self) -> str:
        """The file's text when the component was decided (read now for a recalled decision)."""
        if self.known_base is None:
            self.known_base = self.file.read_text(encoding="utf-8")
        return self.known_base


class Component:
    """Patches that share a file, transitively: decided as one (compared by identity)."""

    # Made by a recalled activation: its files, as the memo names them, are checked when decided
    # (set on those only: a warm import makes every component).
    recalled = False

    def __init__(
        self,
        entries: list[Entry],
        files: dict[str, str],  # torch-relative path -> the installed file
        targets: dict[str, Target],  # path -> target
    ) -> None:
        self._entries: list[Entry] | None = entries
        self._make: Callable[[Component], list[Entry]] | None = None
        self._files = files
        self._paths: dict[str, Path] | None = None
        self.targets = targets
        self.decided = False
        self.modules: dict[str, ModulePlan] = {}  # module name -> plan
        self.texts: dict[str, str] = {}  # path -> text its module runs (swapped or planned)
        self.reverted = False
        # Recalled from the decision cache: ``texts`` and plans' code come on demand.
        self.remembered = False

    @classmethod
    def made_when_used(
        cls, make: Callable[[Component], list[Entry]], files: dict[str, str], targets: dict[str, Target]
    ) -> Component:
        """A recalled component, whose members ``make`` makes when it is first used (engine/roster.py)."""
        component = cls([], files, targets)
        component._entries, component._make = None, make
        return component

    def __repr__(self) -> str:
        members = [e.id for e in self._entries] if self._entries is not None else "not made"
        return f"Component({members}, decided={self.decided})"

    @property
    def entries(self) -> list[Entry]:
        """The members, in series order (made now if the component was recalled and not yet used)."""
        if self._entries is None:
            assert self._make is not None
            self._entries, self._make = self._make(self), None
        return self._entries

    @property
    def files(self) -> dict[str, Path]:
        """Each file's ``Path``, made when first used: a warm import decides few components."""
        if self._paths is None:
            self._paths = {p: Path(f) for p, f in self._files.items()}
        return self._paths


def group_components(
    entries: list[Entry],
    version: str,
    settle: Callable[[Entry, PatchState, str], None],
    missing: set[tuple[str, str]] | None = None,
) -> list[Component]:
    """The components of the pending ``entries``, in series order.

    A patch keeps the variants written for torch ``version`` whose files all exist in it; with
    none, ``settle`` gives it its final state (``failed``, or ``drift`` when no variant is written
    for this torch). ``missing`` gets the (path, module) of each file looked up in vain: what a
    recalled activation looks up again (:mod:`.caches.activation_memo`).
    """
    from ..series.decide import decide, fitting_variants  # here: a remembered activation groups nothing

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
                    module = Target.from_path(path).module
                    files[path] = find_file(path, module)
                    if files[path] is None and missing is not None:
                        missing.add((path, module))
        present = [v for v in fitting if all(files[p] is not None for p in v.python_paths)]
        entry.targets = list(dict.fromkeys(Target.from_path(p) for v in present for p in v.python_paths))
        if not present:
            absent = sorted({p for v in fitting for p in v.python_paths if files[p] is None})
            settle(entry, PatchState.FAILED, f"{', '.join(absent)} not found in the installed torch")
    active = [e for e in active if e.state == PatchState.PENDING]
    # Union of entries that share a path (union-find over series positions: linear in the series).
    parent = list(range(len(active)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}  # path -> the first entry that changes it
    for i, entry in enumerate(active):
        for target in entry.targets:
            j = first.setdefault(target.path, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    members: dict[int, list[Entry]] = {}
    for i, entry in enumerate(active):  # series order within a component, components by first entry
        members.setdefault(root(i), []).append(entry)
    components = []
    for ordered in members.values():
        targets = {t.path: t for e in ordered for t in e.targets}
        component = Component(ordered, {p: str(files[p]) for p in targets}, targets)
        for entry in ordered:
            entry.component = component
            entry.reason = "waiting for import of " + ", ".join(t.module for t in entry.targets)
        components.append(component)
    return components
