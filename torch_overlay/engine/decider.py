"""Decide a component: walk its patches over the files on disk, compile, commit late swaps.

Modules not imported yet get a :class:`~.components.ModulePlan` (the patched source they will
execute); modules already imported get their changed functions' code swapped. Everything is
compiled before anything is committed, so a patch applies to all of its modules or to none.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

from .._state import PatchState
from ..series.patchfile import PatchParseError
from .caches.decision_record import decision_key, recall_decision, remember
from .caches.folder import CacheFolder
from .caches.record import file_signature, settled
from .components import Component, Entry, ModulePlan
from .job_lines import LATE_REMEDY
from .outcome import Outcome

if TYPE_CHECKING:
    from ..series.decide import Tried
    from .codeswap import SwapPlan

__all__ = [
    "decide_component",
    "LATE_DEPENDENT",
    "LATE_IMPORT",
    "LATE_REMEDY",
    "load_plan_code",
    "plan_for_import",
    "texts_of",
]

# A patch lost because its module ran before the overlay: "imported too late" with the remedy,
# never drift (drift tells the user that torch changed and the fix is no longer to be trusted).
LATE_IMPORT = "imported too late: {module} was imported before torch_overlay: {why}; " + LATE_REMEDY
LATE_DEPENDENT = (
    "imported too late: it applies on top of {earlier}, lost because {module} was imported before "
    "torch_overlay; " + LATE_REMEDY
)


def decide_component(
    component: Component, importing: str | None, version: str, cache: CacheFolder
) -> tuple[dict[int, Outcome], set[str]]:
    """Each pending entry's outcome (by ``id``) and the component's modules already imported.

    Sets ``component.modules`` (the plans of modules to come) and ``component.texts``; swaps
    committed for imported modules are on each entry's ``plans``.
    """
    imported = {t.module for t in component.targets.values() if t.module in sys.modules and t.module != importing}
    # A patch made only now (a recalled activation) that could not be, or whose file this process
    # does not find: it fails alone, as at activation.
    failed_early = {
        id(e): f"malformed patch: {e.patch.error}"
        for e in component.entries
        if e.state == PatchState.PENDING and e.patch.error
    }
    if component.recalled:
        failed_early = {**_files_as_found(component), **failed_early}
    key = None
    if not imported and not failed_early and cache.usable:  # nothing to swap: the decision may be recalled, or kept
        key = decision_key(component, version)
        recalled = recall_decision(key, component, cache)
        if recalled is not None:
            component.decided = True
            return recalled, imported
    # Here, not at the top: a recalled decision (every warm `import torch`) decides no patch.
    from ..series.decide import carried_stack, decide
    from .codeswap import CodeSwapError, plan_swap
    from .modcode import compile_module

    signatures = {path: file_signature(file) for path, file in component.files.items()}
    texts = {path: file.read_text(encoding="utf-8") for path, file in component.files.items()}
    excluded: dict[int, str] = dict(failed_early)
    pending = [e.patch for e in component.entries if e.state == PatchState.PENDING and id(e) not in failed_early]
    tried: Tried = {}  # each reverse diff is tried once over these texts, here or by decide
    carried = carried_stack(pending, version, texts, python_only=True, tried=tried)
    while True:
        current = dict(texts)
        # The texts as if no patch had been lost to a late import: a later patch of the same file
        # written on top of a lost one fits these, not ``current``, and is lost to that import too.
        ideal: dict[str, str] | None = None
        lost: dict[str, str] = {}  # id of a patch lost to a late import -> the module
        plans: list[tuple[Entry, list[SwapPlan]]] = []
        modules = {
            t.module: ModulePlan(t, component.files[p], signatures[p], known_base=texts[p])
            for p, t in component.targets.items()
            if t.module not in imported
        }
        outcomes: dict[int, Outcome] = {}
        for entry in component.entries:
            if entry.state != PatchState.PENDING:
                continue
            if id(entry) in excluded:
                outcomes[id(entry)] = Outcome(PatchState.FAILED, excluded[id(entry)], entry.variant)
                continue
            try:
                decision = carried.get(entry.id) or decide(entry.patch, version, current, python_only=True, tried=tried)
            except PatchParseError as exc:  # its hunks are parsed only now
                outcomes[id(entry)] = Outcome(PatchState.FAILED, f"malformed patch: {exc}", None)
                continue
            if ideal is not None:
                on_ideal = decide(entry.patch, version, ideal, python_only=True)
                if on_ideal.state == PatchState.APPLIED:
                    ideal = on_ideal.texts
                    if decision.state != PatchState.APPLIED:
                        mine = {t.module for t in entry.targets}
                        earlier, module = next(((i, m) for i, m in lost.items() if m in mine), next(iter(lost.items())))
                        reason = LATE_DEPENDENT.format(earlier=earlier, module=module)
                        outcomes[id(entry)] = Outcome(PatchState.FAILED, reason, on_ideal.variant, late=module)
                        continue
            if decision.state != PatchState.APPLIED:
                outcomes[id(entry)] = Outcome(decision.state, decision.reason, decision.variant)
                continue
            new = {p: t for p, t in decision.texts.items() if t != current[p]}
            # In the patch's own file order: a definition it adds comes before its use elsewhere.
            late = [t.path for t in entry.targets if t.path in new and t.module in imported]
            try:
                swaps = [
                    plan_swap(
                        sys.modules[component.targets[p].module],
                        current[p],
                        new[p],
                        f"{component.files[p]}[torch_overlay:{entry.id}]",
                        cache,
                    )
                    for p in late
                ]
            except CodeSwapError as exc:
                module = component.targets[late[0]].module
                reason = LATE_IMPORT.format(module=module, why=exc)
                outcomes[id(entry)] = Outcome(PatchState.FAILED, reason, decision.variant, late=module)
                if ideal is None:
                    ideal = decision.texts
                lost.setdefault(entry.id, module)
                continue
            plans.append((entry, swaps))
            current = decision.texts
            for path, text in new.items():
                plan = modules.get(component.targets[path].module)
                if plan is not None:
                    plan.steps.append((entry.id, text))
                    plan.entries.append(entry)
            outcomes[id(entry)] = Outcome(PatchState.APPLIED, decision.reason, decision.variant, set(new))
        failure = _compile_and_commit(modules, plans, cache, compile_module)
        if failure is None:
            break
        entry, reason = failure
        excluded[id(entry)] = reason
    component.decided = True
    component.modules = {name: plan for name, plan in modules.items() if plan.steps}
    component.texts = current
    # Kept if the files did not change while it was decided, nor so recently that they could again
    # within their timestamps' resolution without a new signature.
    if (
        key is not None
        and decision_key(component, version) == key
        and not excluded
        and settled(list(signatures.values()))
    ):
        remember(key, component, outcomes, cache)
    return outcomes, imported


def _files_as_found(component: Component) -> dict[int, str]:
    """Make a recalled component's files those this process finds (the activation memo named them,
    and a memo is not believed about a file); the reason of each pending entry whose file is gone."""
    from ..series.versions import find_file

    component.recalled = False
    gone: dict[int, str] = {}
    for path, file in component.files.items():
        found = find_file(path, component.targets[path].module)
        if found is None:
            why = f"{path} not found in the installed torch"
            pending = [e for e in component.entries if e.state == PatchState.PENDING]
            gone.update((id(e), why) for e in pending if path in {t.path for t in e.targets})
        elif found != file:
            component.files[path] = found
    return gone


def _compile_and_commit(
    modules: dict[str, ModulePlan],
    plans: list[tuple[Entry, list[SwapPlan]]],
    cache: CacheFolder,
    compile_module: object,
) -> tuple[Entry, str] | None:
    """Compile every planned module, then commit the swaps; the first failing entry, or None.

    Compiling first means a patched source that does not compile fails its patch before any
    module of the component runs patched code (all or nothing).
    """
    for name, plan in modules.items():
        if not plan.steps:
            continue
        try:
            plan.code = compile_module(cache, name, plan.file, plan.base, plan.steps)  # type: ignore[operator]
        except SyntaxError as exc:
            return plan.entries[-1], f"the patched {plan.target.path} does not compile: {exc}"
    committed: list[tuple[Entry, SwapPlan]] = []
    for entry, swaps in plans:
        try:
            for swap in swaps:
                swap.commit()
                committed.append((entry, swap))
        except Exception as exc:  # noqa: BLE001 - a half-applied patch is worse than none
            for _, swap in reversed(committed):
                swap.revert()
            return entry, f"{type(exc).__name__} while swapping code: {exc}"
    for entry, swap in committed:
        entry.plans += (swap,)
    return None


def replan_swapped_module(component: Component, name: str, cache: CacheFolder) -> ModulePlan:
    """The plan of a module whose functions were swapped and that is executed again
    (``importlib.reload``): it runs the patched source, or the reload would silently drop the fix."""
    from .modcode import compile_module

    entries = [e for e in component.entries if name in e.swapped]
    path, target = next((p, t) for p, t in component.targets.items() if t.module == name)
    file = component.files[path]
    plan = ModulePlan(target, file, file_signature(file), entries=entries)
    plan.steps = [(e.id, component.texts[path]) for e in entries[-1:]]
    plan.code = compile_module(cache, name, file, plan.base, plan.steps)
    component.modules[name] = plan
    return plan


def _walk(component: Component, path: str, base: str) -> list[tuple[str, str]]:
    """(patch id, text after it) for each applied patch of ``component`` that changes ``path``."""
    from ..series.hunks import apply_file_diff

    module = component.targets[path].module
    text, steps = base, []
    for entry in component.entries:
        if entry.variant is None or module not in entry.changes:
            continue
        for diff in entry.variant.files:
            if diff.path == path:
                text = apply_file_diff(text, diff)
        steps.append((entry.id, text))
    return steps


def plan_for_import(
    component: Component, module: types.ModuleType, cache: CacheFolder
) -> tuple[ModulePlan | None, bool]:
    """The plan ``module`` (being imported, its component decided) runs, and whether it is ready.

    None: the module runs its own code. Not ready: its file changed on disk since the decision.
    """
    name = module.__name__
    plan = component.modules.get(name)
    if plan is None and any(name in e.swapped for e in component.entries):
        plan = replan_swapped_module(component, name, cache)
    if plan is None or (plan.code is None and not plan.code_key):
        return None, False
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    try:
        if origin is None or file_signature(Path(origin)) != plan.signature:
            return plan, False
        if plan.code is None:
            load_plan_code(component, plan, cache)
    except Exception:  # noqa: BLE001 - the file changed under a recalled decision
        return plan, False
    return plan, True


def load_plan_code(component: Component, plan: ModulePlan, cache: CacheFolder) -> None:
    """Give a recalled plan its code: from the code cache, or built again from the files.

    The decision was recalled for files with the plan's signature, so the patches apply as they did;
    raises (``HunkMismatch``, ``SyntaxError``, ``OSError``) only if the files changed since.
    """
    from .modcode import compile_module, load_module_code

    plan.code = load_module_code(cache, plan.code_key, plan.file)
    if plan.code is None:
        plan.steps = _walk(component, plan.target.path, plan.base)
        plan.code = compile_module(cache, plan.target.module, plan.file, plan.base, plan.steps)


def texts_of(component: Component) -> dict[str, str]:
    """Path -> the text its module runs or will run (for a recalled decision, worked out now)."""
    if component.remembered and not component.texts:
        for path, file in component.files.items():
            base = file.read_text(encoding="utf-8")
            steps = _walk(component, path, base)
            component.texts[path] = steps[-1][1] if steps else base
    return component.texts
