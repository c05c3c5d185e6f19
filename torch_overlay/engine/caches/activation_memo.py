"""Activation remembered per torch release, so that a warm ``import torch`` does not redo it.

Activation settles each patch that its fields alone decide (``not needed``, ``upstream``,
switched off), finds the files of the others in the installed torch and groups them into
components. That depends only on the series (its index key: every patch file's ``stat``), the
torch release and where it is installed, and the switches that turn patches off; it cost more
per patch file than anything else a warm import did. The result is kept in the code cache under
a key made of exactly those, as plain tuples, and a later process recalls it: no version is
parsed, no torch file is looked up until a component is decided (which ``stat``s its files), and
no patch, nor the entry of a component's member, is made until it is used (``engine/roster.py``): a
warm import costs little more per patch file than its ``stat``, whatever the length of the series.

A memo that is not exactly the expected shape is ignored and activation runs again (and stores a
new one). The series index is read when a patch is first made, and believed only if it names the
memo's patches in order; otherwise the patches are read from the files.

Only what the series, the release and the files on disk decide is believed from a memo, never what
one process happened to see: a file that activation did not find is looked up again by every
process that recalls the memo (found now, the memo is not replayed), a memo never says a patch is
applied or pending, and each file it names for a component is checked against the file this
process finds when the component is decided (:func:`~.decider.decide_component`).
"""

from __future__ import annotations

import os
from itertools import chain
from operator import itemgetter
from typing import Any, TYPE_CHECKING

from ..._state import PatchState, Target
from ...series.versions import find_file, torch_root, torch_version
from ..components import Component, Entry, group_components
from ..roster import Roster
from .record import Record
from .series_index import IndexedPatches

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..._config import Config
    from ...series.series import Patch
    from .folder import CacheFolder

__all__ = ["ACTIVATION_MEMO", "memo_key", "recall_activation", "record", "replay", "settle_and_group"]
# What activation settles a patch to: a memo saying anything else (applied, pending) is not believed.
_SETTLED = frozenset(PatchState) - {PatchState.APPLIED, PatchState.PENDING}
_STATE = itemgetter(1)


def recall_activation(
    patches_dir: Path, config: Config, cache: CacheFolder, key: str
) -> tuple[Roster, list[tuple[Entry, PatchState, str]]] | None:
    """The series' entries and components as the memo for this torch remembers them, and the
    state of each patch it settled; None when there is no memo that fits. ``key``: the series
    folder's index key (:func:`~.series_index.series_key`).

    No patch is made, and no entry for a member of a component until it is used (``engine/roster.py``):
    an entry makes its patch from the series index when it is first used
    (:class:`~.series_index.IndexedPatches`), so a warm import costs little more per patch file
    than its ``stat``.
    """
    if not cache.usable:
        return None
    found = ACTIVATION_MEMO.load(cache, memo_key(key, torch_version(), str(torch_root()), config))
    if found is None:
        return None
    # The index is read when a patch is first made, and believed only if it names the memo's
    # patches in order: a warm import that makes none does not read it.
    patches = IndexedPatches(patches_dir, cache, key, list(found[0][0]))
    settled: list[tuple[Entry, PatchState, str]] = []
    roster = replay(found[0], patches.get, lambda *s: settled.append(s))
    return None if roster is None else (roster, settled)


def settle_and_group(
    entries: list[Entry],
    series_key: str | None,
    config: Config,
    cache: CacheFolder,
    settle: Callable[[Entry, PatchState, str], None],
) -> list[Component]:
    """Settle what the patches' fields decide (through ``settle``) and group the others into
    components; remembered for this torch when the series is indexed (``series_key``)."""
    for entry in entries:
        settled = _settled_without_files(entry, config)
        if settled is not None:
            settle(entry, *settled)
    missing: set[tuple[str, str]] = set()
    components = group_components(entries, torch_version(), settle, missing)
    if series_key is not None:
        key = memo_key(series_key, torch_version(), str(torch_root()), config)
        ACTIVATION_MEMO.store(cache, key, record(entries, components, missing))
    return components


def _settled_without_files(entry: Entry, config: Config) -> tuple[PatchState, str] | None:
    """The state a patch has before any of its files is read: malformed, switched off, or settled
    by its fields alone (no file of such a patch is read or watched)."""
    if entry.patch.error:
        return PatchState.FAILED, f"malformed patch: {entry.patch.error}"
    if not config.enabled:
        return PatchState.DISABLED, "TORCH_OVERLAY=0"
    if entry.id in config.disabled_ids:
        return PatchState.DISABLED, "TORCH_OVERLAY_DISABLE"
    from ...series.decide import decide_by_header  # here: a remembered activation decides nothing

    decision = decide_by_header(entry.patch, torch_version())
    return None if decision is None else (decision.state, decision.reason)


def memo_key(series_key: str, version: str, root: str, config: Config) -> str:
    """The key of activation's result for this series, torch and switches."""
    switches = ("on" if config.enabled else "off", *sorted(config.disabled_ids))
    return ACTIVATION_MEMO.key(series_key, version, root, *switches)


def record(entries: list[Entry], components: list[Component], missing: set[tuple[str, str]]) -> tuple[Any, ...]:
    """What activation made of ``entries``, marshal-native: the settled patches' states, the
    components (their members by position, each member's files, each file's module and path), and
    the (path, module) of each file ``missing`` (looked up again by every process that recalls it)."""
    position = {id(e): i for i, e in enumerate(entries)}
    settled = tuple((i, str(e.state), e.reason) for i, e in enumerate(entries) if e.state != PatchState.PENDING)
    grouped = tuple(
        (
            tuple(position[id(e)] for e in c.entries),
            tuple(tuple(t.path for t in e.targets) for e in c.entries),
            tuple((path, c.targets[path].module, str(file)) for path, file in c.files.items()),
        )
        for c in components
    )
    return tuple(e.id for e in entries), settled, grouped, tuple(sorted(missing))


def _is_memo(value: Any) -> bool:
    return type(value) is tuple and len(value) == 4 and all(type(part) is tuple for part in value)


# Bump when the memo's shape, or what activation derives from the series, changes.
ACTIVATION_MEMO = Record("activation memo", 4, _is_memo)


def replay(
    memo: tuple[Any, ...], source: Callable[[str], Patch], settle: Callable[[Entry, PatchState, str], None]
) -> Roster | None:
    """The entries and components ``memo`` describes (each settled patch given its state by
    ``settle``; each entry makes its patch with ``source``), or None, touching nothing, when the
    memo is not exactly what :func:`record` makes.

    The members of a component are made when it is first used: here they are only checked, at C
    speed (a warm import pays little per patch whose modules it never imports).
    """
    ids, settled, grouped, missing = memo
    try:
        if not set(map(type, ids)) <= {str}:
            return None
        if not all(type(row) is tuple and len(row) == 2 and type(row[0]) is type(row[1]) is str for row in missing):
            return None
        # A file not found then (gone a moment, or hidden by a package stubbed in sys.modules) may
        # be found now: then this process activates again. One lookup per such file, none usually.
        if any(find_file(path, module) is not None for path, module in missing):
            return None
        # Every position is settled or in exactly one component (a bool or negative one is not a position).
        positions = [i for i, _, _ in settled]
        positions += chain.from_iterable([members for members, _, _ in grouped])
        if set(map(type, positions)) - {int} or sorted(positions) != list(range(len(ids))):
            return None
        states = [(i, PatchState(state), reason) for i, state, reason in settled]
        if any(type(reason) is not str for _, _, reason in states) or not _SETTLED.issuperset(map(_STATE, states)):
            return None
        slots: list[Entry | None] = [None] * len(ids)
        components = []
        for members, paths, files in grouped:
            targets = {path: Target(path, module) for path, module, _ in files}
            if not (targets and all(type(p) is str for part in files for p in part)):
                return None
            # Each member changes some of the component's files (C-speed checks: one per member).
            if not (len(paths) == len(members) and set(map(type, paths)) == {tuple} and all(paths)):
                return None
            if not set(chain.from_iterable(paths)) <= targets.keys():
                return None
            # A torch file removed since (a reinstall of the same release) fails its patches, as
            # activation says: one stat per file of the components, not per patch.
            if not all(map(os.path.isfile, [file for _, _, file in files])):
                return None
            make = _members(ids, slots, source, members, paths, targets)
            component = Component.made_when_used(make, {path: file for path, _, file in files}, targets)
            component.recalled = True  # its files are checked against those found when it is decided
            components.append(component)
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    for i, state, reason in states:
        slots[i] = entry = Entry(ids[i], source)
        settle(entry, state, reason)
    return Roster(list(ids), slots, components)


def _members(
    ids: tuple[str, ...],
    slots: list[Entry | None],
    source: Callable[[str], Patch],
    members: tuple[int, ...],
    paths: tuple[tuple[str, ...], ...],
    targets: dict[str, Target],
) -> Callable[[Component], list[Entry]]:
    """What makes the entries of a recalled component's ``members`` (and puts them in ``slots``)."""

    def make(component: Component) -> list[Entry]:
        # Most members of a component change the same files: their targets and reason are shared.
        seen: dict[tuple[str, ...], tuple[list[Target], str]] = {}
        made = []
        for i, own in zip(members, paths):
            if own not in seen:
                listed = [targets[p] for p in own]
                seen[own] = listed, "waiting for import of " + ", ".join([t.module for t in listed])
            slots[i] = entry = Entry(ids[i], source)
            entry.component = component
            entry.targets, entry.reason = seen[own]
            made.append(entry)
        return made

    return make
