"""Remember how a component was decided, so that the next process need not read torch's files.

Deciding a component reads, patches and hashes every file it changes (on torch 2.11 that is
``_inductor/lowering.py`` and ``ir.py``, decided during ``import torch`` because a patch also
changes ``_meta_registrations``). A decision taken before any of the component's modules was
imported depends only on this Python, the torch version, the texts of its patches and its files;
it is stored in the code cache under a key made of those (a file by its size, mtime and inode, as
``__pycache__`` does). A later process with the same key takes each entry's outcome from the record,
and each module's compiled code from the code cache when that module is imported: the files are
neither read nor hashed. A decision with swapped code (a module imported before the overlay) is
never stored or recalled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TYPE_CHECKING

from .._state import PatchState
from .components import ModulePlan
from .outcome import Outcome

if TYPE_CHECKING:
    from .codecache import CodeCache
    from .components import Component

__all__ = ["decision_key", "file_signature", "recall", "remember"]

KIND = "component decision 1"


def file_signature(file: Path) -> tuple[int, int, int]:
    """(size, mtime in ns, inode) of ``file``: a rewrite changes at least one of them."""
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns, st.st_ino


def decision_key(component: Component, version: str) -> str:
    """What the decision of ``component`` depends on, as one string."""
    parts = [KIND, sys.version, version]
    for entry in component.entries:
        if entry.state == PatchState.PENDING:
            parts.append(entry.id)
            parts += [v.digest for v in entry.patch.variants]  # from the series index: no patch is read
    for path, file in sorted(component.files.items()):
        parts.append(f"{path}={file}:{file_signature(file)}")
    return "\0".join(parts)


def remember(key: str, component: Component, outcomes: dict[int, Outcome], cache: CodeCache) -> None:
    """Store the decision just taken (every module's code is in ``cache`` already)."""
    entries = []
    for entry in component.entries:
        outcome = outcomes.get(id(entry))
        if outcome is not None:
            variant = outcome.variant.name if outcome.variant is not None else ""
            entries.append((entry.id, str(outcome.state), outcome.reason, variant, sorted(outcome.paths)))
    modules = [
        (name, plan.target.path, plan.code.key, [e.id for e in plan.entries])
        for name, plan in component.modules.items()
        if plan.code is not None
    ]
    cache.store(key, (entries, modules))


def _is_record(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, list) for v in value)


def recall(key: str, component: Component, cache: CodeCache) -> dict[int, Outcome] | None:
    """The outcomes stored for ``key`` (and ``component.modules`` set, code loaded at import), or None."""
    found = cache.load(key, _is_record)
    if found is None:
        return None
    entries, modules = found[0]
    by_id = {e.id: e for e in component.entries}
    try:
        outcomes: dict[int, Outcome] = {}
        for pid, state, reason, variant_name, paths in entries:
            entry = by_id[pid]
            variant = next((v for v in entry.patch.variants if v.name == variant_name), None)
            outcomes[id(entry)] = Outcome(PatchState(state), reason, variant, set(paths))
        plans = {}
        for name, path, code_key, pids in modules:
            file = component.files[path]
            plan = ModulePlan(component.targets[path], file, file_signature(file), code_key=code_key)
            plan.entries = [by_id[p] for p in pids]
            plans[name] = plan
    except (KeyError, ValueError, TypeError, OSError):
        return None  # a record that does not fit this series: decide again
    component.modules = plans
    component.remembered = True
    return outcomes
