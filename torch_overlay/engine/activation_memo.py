"""Activation remembered per torch release, so that a warm ``import torch`` does not redo it.

Activation settles each patch that its fields alone decide (``not needed``, ``upstream``,
switched off), finds the files of the others in the installed torch and groups them into
components. That depends only on the series (its index key: every patch file's ``stat``), the
torch release and where it is installed, and the switches that turn patches off; it cost more
per patch file than anything else a warm import did. The result is kept in the code cache under
a key made of exactly those, as plain tuples, and a later process recalls it: no version is
parsed, no torch file is looked up until a component is decided (which ``stat``s its files), and
no patch is made until it is used (a warm import costs little more per patch file than its
``stat``, whatever the length of the series).

A memo that is not exactly the expected shape, or that does not name the index's patches in
order, is ignored and activation runs again (and stores a new one).
"""

from __future__ import annotations

import os
from typing import Any, TYPE_CHECKING

from .._state import PatchState, Target
from ..series.versions import torch_root, torch_version
from .components import Component, Entry, group_components
from .series_index import IndexedPatches, series_key

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from .._config import Config
    from .codecache import CodeCache

__all__ = ["memo_key", "recall", "record", "replay", "settle_and_group"]

# Bump when the memo's shape, or what activation derives from the series, changes.
KIND = "activation memo 2"


def recall(
    patches_dir: Path, config: Config, cache: CodeCache
) -> tuple[list[Entry], list[Component], list[tuple[Entry, PatchState, str]]] | None:
    """The entries and components of the series as the memo for this torch remembers them, and
    the state of each patch it settled; None when there is no memo that fits.

    No patch is made: each entry makes its own from the series index when it is first used
    (:class:`~.series_index.IndexedPatches`), so a warm import costs little more per patch file
    than its ``stat``.
    """
    if not cache.usable:
        return None
    try:
        series, _ = series_key(patches_dir)
    except OSError:
        return None
    found = cache.load(memo_key(series, torch_version(), str(torch_root()), config), _is_memo)
    if found is None:
        return None
    # The memo names the patches of the index, in its order (an index's keys are unique).
    patches = IndexedPatches(patches_dir, cache, series)
    ids = found[0][1]
    if list(ids) != patches.ids() or not all(type(pid) is str for pid in ids):
        return None
    entries = [Entry(pid, source=patches.get) for pid in ids]
    settled: list[tuple[Entry, PatchState, str]] = []
    components = replay(found[0], entries, lambda *s: settled.append(s))
    return None if components is None else (entries, components, settled)


def settle_and_group(
    entries: list[Entry],
    series_key: str | None,
    config: Config,
    cache: CodeCache,
    settle: Callable[[Entry, PatchState, str], None],
) -> list[Component]:
    """Settle what the patches' fields decide (through ``settle``) and group the others into
    components; remembered for this torch when the series is indexed (``series_key``)."""
    for entry in entries:
        settled = _settled_without_files(entry, config)
        if settled is not None:
            settle(entry, *settled)
    components = group_components(entries, torch_version(), settle)
    if series_key is not None:
        key = memo_key(series_key, torch_version(), str(torch_root()), config)
        cache.store(key, record(entries, components))
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
    from ..series.decide import decide_by_header  # here: a remembered activation decides nothing

    decision = decide_by_header(entry.patch, torch_version())
    return None if decision is None else (decision.state, decision.reason)


def memo_key(series_key: str, version: str, root: str, config: Config) -> str:
    """The key of activation's result for this series, torch and switches."""
    switches = ("on" if config.enabled else "off", *sorted(config.disabled_ids))
    return "\0".join((KIND, series_key, version, root, *switches))


def record(entries: list[Entry], components: list[Component]) -> tuple[Any, ...]:
    """What activation made of ``entries``, marshal-native: the settled patches' states, and the
    components (their members by position, each member's files, each file's module and path)."""
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
    return KIND, tuple(e.id for e in entries), settled, grouped


def _is_memo(value: Any) -> bool:
    if not (type(value) is tuple and len(value) == 4 and value[0] == KIND):
        return False
    return all(type(part) is tuple for part in value[1:])


def replay(
    memo: tuple[Any, ...], entries: list[Entry], settle: Callable[[Entry, PatchState, str], None]
) -> list[Component] | None:
    """The components ``memo`` describes for ``entries`` (each settled patch given its state by
    ``settle``), or None, touching nothing, when the memo does not fit them."""
    _, ids, settled, grouped = memo
    if list(ids) != [e.id for e in entries]:
        return None
    def positions(found: Any) -> bool:  # entries' positions (a negative or bool index fits a list too)
        return all(type(i) is int and 0 <= i < len(entries) for i in found)

    try:
        if not positions(i for i, _, _ in settled):
            return None
        states = [(entries[i], PatchState(state), reason) for i, state, reason in settled]
        if any(type(reason) is not str for _, _, reason in states):
            return None
        made = []
        for members, paths, files in grouped:
            targets = {path: Target(path, module) for path, module, _ in files}
            if not (targets and positions(members) and all(type(p) is str for part in files for p in part)):
                return None
            # A torch file removed since (a reinstall of the same release) fails its patches, as
            # activation says: one stat per file of the components, not per patch.
            if not all(map(os.path.isfile, [file for _, _, file in files])):
                return None
            chosen = [entries[i] for i in members]
            if len(paths) != len(chosen):
                return None
            # Most members of a component change the same files: their targets and reason are shared.
            seen: dict[tuple[str, ...], tuple[list[Target], str]] = {}
            for own in paths:
                if own not in seen:
                    listed = [targets[p] for p in own]
                    seen[own] = listed, "waiting for import of " + ", ".join([t.module for t in listed])
            component = Component(chosen, {path: file for path, _, file in files}, targets)
            made.append((component, [seen[own] for own in paths]))
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    for entry, state, reason in states:
        settle(entry, state, reason)
    for component, own_targets in made:
        for entry, (listed, reason) in zip(component.entries, own_targets):
            entry.component, entry.targets, entry.reason = component, listed, reason
    return [component for component, _ in made]
