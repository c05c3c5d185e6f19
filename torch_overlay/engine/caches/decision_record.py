"""Remember how a component was decided, so that the next process need not read torch's files.

Deciding a component reads, patches and hashes every file it changes (on torch 2.11 that is
``_inductor/lowering.py`` and ``ir.py``, decided during ``import torch`` because a patch also
changes ``_meta_registrations``). A decision taken before any of the component's modules was
imported depends only on this Python, the torch version, the texts of its patches and its files;
it is stored in the cache folder under a key made of those (a file by its ``stat`` signature:
:func:`.record.file_signature`). A later process with the same key
takes each entry's outcome from the record, and each module's compiled code from the code cache when
that module is imported: the files are neither read nor hashed. A decision with swapped code (a
module imported before the overlay) is never stored or recalled, nor one taken while a file's
mtime or ctime is within ``record.RACY_NS`` of now (:func:`.record.settled`).

A record is believed only if it says what a decision of this component can: every pending patch
has an outcome, an applied one names a variant of its patch and files of the component, and each
module's code is the code cache entry compiled for that module, from that file, for exactly the
applied patches that change it, in series order (:func:`recall_decision`).
"""

from __future__ import annotations

import sys
from typing import Any, TYPE_CHECKING

from ..._state import PatchState
from ..components import ModulePlan
from ..outcome import Outcome
from .record import file_signature, Record

if TYPE_CHECKING:
    from ..components import Component
    from .folder import CacheFolder

__all__ = ["DECISION", "decision_key", "recall_decision", "remember"]


def _is_record(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, list) for v in value)


DECISION = Record("component decision", 3, _is_record)


def decision_key(component: Component, version: str) -> str:
    """What the decision of ``component`` depends on, as one string."""
    parts = [sys.version, version]
    for entry in component.entries:
        if entry.state == PatchState.PENDING:
            parts.append(entry.id)
            parts += [v.digest for v in entry.patch.variants]  # from the series index: no patch is read
    for path, file in sorted(component.files.items()):
        parts.append(f"{path}={file}:{file_signature(file)}")
    return DECISION.key(*parts)


def remember(key: str, component: Component, outcomes: dict[int, Outcome], cache: CacheFolder) -> None:
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
    DECISION.store(cache, key, (entries, modules))


def recall_decision(key: str, component: Component, cache: CacheFolder) -> dict[int, Outcome] | None:
    """The outcomes stored for ``key`` (and ``component.modules`` set, code loaded at import), or None."""
    found = DECISION.load(cache, key)
    if found is None:
        return None
    entries, modules = found[0]
    by_id = {e.id: e for e in component.entries}
    try:
        outcomes: dict[int, Outcome] = {}
        for pid, state, reason, variant_name, paths in entries:
            entry = by_id[pid]
            variant = next((v for v in entry.patch.variants if v.name == variant_name), None)
            outcome = Outcome(PatchState(state), reason, variant, set(paths))
            if id(entry) in outcomes or entry.state != PatchState.PENDING or not _possible(outcome, component):
                return None
            outcomes[id(entry)] = outcome
        if len(outcomes) != len([e for e in component.entries if e.state == PatchState.PENDING]):
            return None
        plans = {}
        for name, path, code_key, pids in modules:
            file = component.files[path]
            plan = ModulePlan(component.targets[path], file, file_signature(file), code_key=code_key)
            plan.entries = [by_id[p] for p in pids]
            plans[name] = plan
    except (KeyError, ValueError, TypeError, OSError):
        return None  # a record that does not fit this series: decide again
    if not _plans_fit(component, outcomes, plans):
        return None
    component.modules = plans
    component.remembered = True
    return outcomes


def _possible(outcome: Outcome, component: Component) -> bool:
    """Whether a decision of ``component`` can have ``outcome``: applied, with a variant of its
    patch and some of the component's files that variant changes; otherwise no file at all."""
    if type(outcome.reason) is not str or outcome.state == PatchState.PENDING:
        return False
    if outcome.state != PatchState.APPLIED:
        return not outcome.paths
    variant = outcome.variant
    if variant is None or not outcome.paths:
        return False
    return outcome.paths <= set(variant.python_paths) & component.targets.keys()


def _plans_fit(component: Component, outcomes: dict[int, Outcome], plans: dict[str, ModulePlan]) -> bool:
    """Whether ``plans`` are those the decision makes: one per module an applied patch changes,
    each running the code compiled for that module and file from exactly those patches, in order."""
    changing: dict[str, list[str]] = {}
    for entry in component.entries:  # series order
        outcome = outcomes.get(id(entry))
        if outcome is not None and outcome.state == PatchState.APPLIED:
            for path in outcome.paths:
                changing.setdefault(component.targets[path].module, []).append(entry.id)
    if changing.keys() != plans.keys():
        return False
    if not plans:  # every patch settled otherwise (upstream, drift): no code to check, nor modcode to import
        return True
    from ..modcode import module_code_key_fits

    return all(
        plan.target.module == name
        and [e.id for e in plan.entries] == changing[name]
        and module_code_key_fits(plan.code_key, name, plan.file, changing[name])
        for name, plan in plans.items()
    )
