"""The overlay: decides each patch's state for the installed torch and applies it when due.

Patches are grouped into components: patches that share a file, transitively. A component is
decided once, when the first of its modules is imported (or at activation if one already is),
walking its patches in series order over the files as they are on disk, exactly as ``apply`` does
on a checkout. A module imported after the overlay then executes its patched source (load-time
application); a module imported before it can only have function code swapped (the late path),
and a patch that needs more than that fails, whole.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ._codecache import CodeCache
from ._config import Config, load_config
from ._decide import decide, decide_by_header, fitting_variants
from ._importhook import ImportHook
from ._invalidate import clear_dtensor_caches, CompileCacheSalt, touches_dtensor
from ._originals import codes_of, find_code, with_code
from ._patchfile import PatchFile
from ._series import Patch, read_series, SeriesError
from ._state import Mode, OverlayError, OverlayWarning, PatchState, PatchStatus, Target
from ._versions import find_file, torch_version

if TYPE_CHECKING:
    from ._codeswap import SwapPlan
    from ._modcode import ModuleCode

__all__ = ["Overlay"]

log = logging.getLogger("torch_overlay")

LATE_IMPORT = (
    "{module} was imported before torch_overlay; import torch_overlay first or use the launcher "
    "(python -m torch_overlay run -- ...)"
)


@dataclass(eq=False)
class _Entry:
    patch: Patch
    state: PatchState = PatchState.PENDING
    reason: str = ""
    variant: PatchFile | None = None
    component: _Component | None = None
    plans: list[SwapPlan] = field(default_factory=list)  # late path: committed swaps
    swapped: set[str] = field(default_factory=set)  # modules whose functions were swapped
    at_import: set[str] = field(default_factory=set)  # modules that executed the patched source
    changes: set[str] = field(default_factory=set)  # modules this patch's variant changes
    # The files of the variants whose files all exist in the installed torch
    targets: list[Target] = field(default_factory=list)
    warned: bool = False

    @property
    def live(self) -> bool:
        return bool(self.swapped or self.at_import)


@dataclass
class _ModulePlan:
    """What a module not yet imported at the decision runs when it is."""

    target: Target
    file: Path
    base: str  # the file's text when the component was decided
    steps: list[tuple[str, str]] = field(default_factory=list)  # (patch id, text after it)
    entries: list[_Entry] = field(default_factory=list)
    code: ModuleCode | None = None

    @property
    def text(self) -> str:
        return self.steps[-1][1] if self.steps else self.base


@dataclass(eq=False)
class _Component:
    entries: list[_Entry]
    files: dict[str, Path]  # torch-relative path -> file
    targets: dict[str, Target]  # path -> target
    decided: bool = False
    modules: dict[str, _ModulePlan] = field(default_factory=dict)  # module name -> plan
    texts: dict[str, str] = field(default_factory=dict)  # path -> text its module runs (swapped or planned)
    reverted: bool = False


def _warn(message: str, stacklevel: int) -> None:
    """One channel for what must be seen: an ``OverlayWarning`` (filterable, shown once per place).

    The log gets it at DEBUG only, so that a job with logging set up does not print it twice; the
    INFO summary line names every drifted or failed patch.
    """
    warnings.warn(message, OverlayWarning, stacklevel=stacklevel)
    log.debug("%s", message)


def _installed_name(file: Path) -> str:
    """The installed file under a name of its own (``dir/./file.py``) for code compiled from it.

    linecache holds the patched text under the plain name (``inspect.getsource(module)`` shows the
    module as it runs); code under this name reads the file on disk, as torch ships it.
    """
    return os.path.join(os.path.dirname(file), ".", os.path.basename(file))


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Overlay:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or load_config()
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._by_module: dict[str, _Component] = {}
        self._hook = ImportHook(self._provide, self._fallback)
        self._salt = CompileCacheSalt(self._hook)
        folder = self.config.cache_dir / "code" if self.config.code_cache and self.config.cache_dir else None
        self._cache = CodeCache(folder)
        self._activated = False
        self._summary_logged = False
        self.problems: list[str] = []  # the series or a switch could not be read as given

    # ----------------------------------------------------------------- setup
    def activate(self) -> None:
        """Read the series and watch the target modules; decide at once those already imported."""
        with self._lock:
            if self._activated:
                return
            self._activated = True
            try:
                patches = read_series(self.config.patches_dir)
            except SeriesError as exc:
                patches = []
                self._problem(str(exc))
            for problem in self.config.problems:
                self._problem(problem)
            self._entries = [_Entry(p) for p in patches]
            known = {e.patch.id for e in self._entries}
            unknown = sorted(self.config.disabled_ids - known)
            if unknown and patches:
                self._problem(
                    f"TORCH_OVERLAY_DISABLE names unknown patch id(s) {', '.join(unknown)}; "
                    f"known: {', '.join(sorted(known))}"
                )
            for entry in self._entries:
                if entry.patch.error:
                    self._set(entry, PatchState.FAILED, f"malformed patch: {entry.patch.error}")
                elif not self.config.enabled:
                    entry.state, entry.reason = PatchState.DISABLED, "TORCH_OVERLAY=0"
                elif entry.patch.id in self.config.disabled_ids:
                    entry.state, entry.reason = PatchState.DISABLED, "TORCH_OVERLAY_DISABLE"
                else:
                    # Settled by the fields alone: no file of such a patch is read or watched.
                    decision = decide_by_header(entry.patch, torch_version())
                    if decision is not None:
                        self._set(entry, decision.state, decision.reason)
            self._build_components()
            self._watch()
            for component in {id(c): c for c in self._by_module.values()}.values():
                if any(t.module in sys.modules for t in component.targets.values()):
                    self._decide(component, importing=None)
            self._raise_if_strict(self._entries)
            self._maybe_log_summary()

    def pass_to_children(self) -> None:
        """Child Python processes started from now on import the overlay first, with this
        process's switches (``TORCH_OVERLAY_CHILDREN=0`` opts out; nothing to pass when off)."""
        from ._children import inherit

        if self.config.enabled and self.config.children and not inherit(os.environ):
            self._problem(
                "the package lacks its bootstrap folder (_bootstrap/sitecustomize.py): child processes "
                "started from here (mp.spawn, DataLoader workers) run without the overlay; reinstall torch_overlay"
            )

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        text = f"torch_overlay: {message}"
        if self.config.strict:
            raise OverlayError(text)
        _warn(text, stacklevel=5)

    def _build_components(self) -> None:
        """Group the active patches by shared files. A patch keeps the variants written for the
        installed torch whose files all exist in it; with none, it fails (or drifts, when no
        variant is written for this torch)."""
        active = [e for e in self._entries if e.state == PatchState.PENDING]
        version = torch_version()
        files: dict[str, Path | None] = {}
        for entry in active:
            fitting = fitting_variants(entry.patch, version)
            if not fitting:
                decision = decide(entry.patch, version, {})
                self._set(entry, decision.state, decision.reason)
                continue
            for variant in fitting:
                for diff in variant.files:
                    if diff.path not in files:
                        files[diff.path] = find_file(diff.path, diff.target.module)
            present = [v for v in fitting if all(files[d.path] is not None for d in v.files)]
            entry.targets = list(dict.fromkeys(d.target for v in present for d in v.files))
            if not present:
                missing = sorted({d.path for v in fitting for d in v.files if files[d.path] is None})
                self._set(entry, PatchState.FAILED, f"{', '.join(missing)} not found in the installed torch")
        active = [e for e in active if e.state == PatchState.PENDING]
        # Union of entries that share a path.
        groups: dict[str, list[_Entry]] = {}
        for entry in active:
            merged = [entry]
            for target in entry.targets:
                other = groups.get(target.path)
                if other is not None and other is not merged:
                    merged = [e for e in other if e not in merged] + merged
            for e in merged:
                for target in e.targets:
                    groups[target.path] = merged
        for group in {id(g): g for g in groups.values()}.values():
            ordered = [e for e in self._entries if e in group]
            targets = {t.path: t for e in ordered for t in e.targets}
            component = _Component(ordered, {p: files[p] for p in targets}, targets)
            for entry in ordered:
                entry.component = component
                waiting = [t.module for t in entry.targets]
                entry.reason = "waiting for import of " + ", ".join(waiting)
            for target in targets.values():
                self._by_module[target.module] = component

    def _watch(self) -> None:
        names = set(self._by_module)
        self._hook.watch(names)
        for name in names:
            self._hook.on_import(name, self._on_imported)

    # ------------------------------------------------------------ decisions
    def _decide(self, component: _Component, importing: str | None) -> None:
        """Walk the component's patches over the files on disk; commit swaps for imported modules."""
        from ._codeswap import CodeSwapError, plan_swap
        from ._modcode import compile_module

        texts = {path: file.read_text(encoding="utf-8") for path, file in component.files.items()}
        imported = {
            t.module for t in component.targets.values() if t.module in sys.modules and t.module != importing
        }
        version = torch_version()
        excluded: dict[int, str] = {}
        while True:
            current = dict(texts)
            plans: list[tuple[_Entry, list[SwapPlan]]] = []
            modules = {
                t.module: _ModulePlan(t, component.files[p], texts[p])
                for p, t in component.targets.items()
                if t.module not in imported
            }
            outcome: dict[int, tuple[PatchState, str, PatchFile | None, set[str]]] = {}
            for entry in component.entries:
                if entry.state != PatchState.PENDING:
                    continue
                if id(entry) in excluded:
                    outcome[id(entry)] = (PatchState.FAILED, excluded[id(entry)], entry.variant, set())
                    continue
                decision = decide(entry.patch, version, current)
                if decision.state != PatchState.APPLIED:
                    outcome[id(entry)] = (decision.state, decision.reason, decision.variant, set())
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
                            f"{component.files[p]}[torch_overlay:{entry.patch.id}]",
                            self._cache,
                        )
                        for p in late
                    ]
                except CodeSwapError as exc:
                    module = component.targets[late[0]].module
                    reason = f"{LATE_IMPORT.format(module=module)}: {exc}"
                    outcome[id(entry)] = (PatchState.FAILED, reason, decision.variant, set())
                    continue
                plans.append((entry, swaps))
                current = decision.texts
                for path, text in new.items():
                    plan = modules.get(component.targets[path].module)
                    if plan is not None:
                        plan.steps.append((entry.patch.id, text))
                        plan.entries.append(entry)
                outcome[id(entry)] = (PatchState.APPLIED, decision.reason, decision.variant, set(new))
            failure = self._compile_and_commit(component, modules, plans, compile_module)
            if failure is None:
                break
            entry, reason = failure
            excluded[id(entry)] = reason
        component.decided = True
        component.modules = {name: plan for name, plan in modules.items() if plan.steps}
        component.texts = current
        for entry in component.entries:
            if id(entry) not in outcome:
                continue
            state, reason, variant, paths = outcome[id(entry)]
            entry.variant = variant
            if state != PatchState.APPLIED:
                self._set(entry, state, reason)
                continue
            entry.changes = {component.targets[p].module for p in paths}
            entry.swapped = entry.changes & imported
            entry.reason = reason
            self._update(entry)
        if any(e.swapped for e in component.entries):
            self._after_change(sorted({m for e in component.entries for m in e.swapped}))

    def _compile_and_commit(
        self,
        component: _Component,
        modules: dict[str, _ModulePlan],
        plans: list[tuple[_Entry, list[SwapPlan]]],
        compile_module: Any,
    ) -> tuple[_Entry, str] | None:
        """Compile every planned module, then commit the swaps; the first failing entry, or None.

        Compiling first means a patched source that does not compile fails its patch before any
        module of the component runs patched code (all or nothing).
        """
        for name, plan in modules.items():
            if not plan.steps:
                continue
            try:
                plan.code = compile_module(self._cache, name, plan.file, plan.base, plan.steps)
            except SyntaxError as exc:
                return plan.entries[-1], f"the patched {plan.target.path} does not compile: {exc}"
        committed: list[tuple[_Entry, SwapPlan]] = []
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
            entry.plans.append(swap)
        return None

    def _update(self, entry: _Entry) -> None:
        """APPLIED once every module the patch changes runs it; PENDING (decided) until then."""
        waiting = sorted(entry.changes - entry.swapped - entry.at_import)
        if waiting:
            entry.state = PatchState.PENDING
            entry.reason = f"applies at import of {', '.join(waiting)}"
            return
        component = entry.component
        changed: list[str] = []
        for name in sorted(entry.changes):
            if name in entry.swapped:
                changed += [q for plan in entry.plans if plan.module.__name__ == name for q in plan.changed]
            elif component is not None and name in component.modules and component.modules[name].code:
                changed += component.modules[name].code.changed.get(entry.patch.id, [])
        name = entry.variant.path.name if entry.variant else ""
        self._set(entry, PatchState.APPLIED, f"{name}: {', '.join(dict.fromkeys(changed)) or 'new definitions'}")

    @staticmethod
    def _mode(entry: _Entry) -> str:
        if entry.state != PatchState.APPLIED:
            return ""
        if entry.swapped and entry.at_import:
            return str(Mode.MIXED)
        return str(Mode.SWAPPED if entry.swapped else Mode.AT_IMPORT)

    # ----------------------------------------------------------- import hook
    def _provide(self, module: types.ModuleType) -> tuple[types.CodeType, str] | None:
        """The code ``module`` runs and its text: its patched source, or None for its own."""
        name = module.__name__
        with self._lock:
            component = self._by_module.get(name)
            if component is None or component.reverted:
                return None
            if not component.decided:
                self._decide(component, importing=name)
            self._raise_if_strict(component.entries)
            plan = component.modules.get(name) or self._reload_plan(component, name)
            if plan is None or plan.code is None:
                return None
            origin = getattr(getattr(module, "__spec__", None), "origin", None)
            try:
                same = origin is not None and Path(origin).read_text(encoding="utf-8") == plan.base
            except OSError:
                same = False
            if not same:
                for entry in plan.entries:
                    self._set(entry, PatchState.FAILED, f"{plan.target.path} changed on disk since the patch was decided")
                self._raise_if_strict(plan.entries)
                return None
            plan.code.register_source()
            return plan.code.code, plan.code.text

    def _reload_plan(self, component: _Component, name: str) -> _ModulePlan | None:
        """A module whose functions were swapped is executed again (``importlib.reload``): run the
        patched source, or the reload would silently drop the fix."""
        from ._modcode import compile_module

        entries = [e for e in component.entries if name in e.swapped]
        if not entries:
            return None
        path, target = next((p, t) for p, t in component.targets.items() if t.module == name)
        file = component.files[path]
        plan = _ModulePlan(target, file, file.read_text(encoding="utf-8"), entries=entries)
        plan.steps = [(e.patch.id, component.texts[path]) for e in entries[-1:]]
        plan.code = compile_module(self._cache, name, file, plan.base, plan.steps)
        component.modules[name] = plan
        return plan

    def _on_imported(self, name: str) -> None:
        """After a watched module executed: record which patches it now runs."""
        with self._lock:
            component = self._by_module.get(name)
            if component is None or not component.decided:
                return
            plan = component.modules.get(name)
            if plan is None:
                return
            for entry in plan.entries:
                if entry.state in (PatchState.PENDING, PatchState.APPLIED) and name in entry.changes:
                    entry.at_import.add(name)
                    self._update(entry)
            self._after_change([name])
            self._maybe_log_summary()

    def _fallback(self, module: types.ModuleType, exc: BaseException) -> bool:
        """The patched source raised while the module executed: fail its patches, run the original."""
        with self._lock:
            component = self._by_module.get(module.__name__)
            plan = component.modules.pop(module.__name__, None) if component else None
            for entry in plan.entries if plan else []:
                self._set(entry, PatchState.FAILED, f"the patched module raised {type(exc).__name__}: {exc}")
            return not self.config.strict and not isinstance(exc, (KeyboardInterrupt, SystemExit))

    def _raise_if_strict(self, entries: list[_Entry]) -> None:
        if not self.config.strict:
            return
        for entry in entries:
            if entry.state in (PatchState.DRIFT, PatchState.FAILED):
                raise OverlayError(f"torch_overlay: patch {entry.patch.id} {entry.state}: {entry.reason}")

    def _after_change(self, modules: list[str]) -> None:
        try:
            if touches_dtensor(modules):
                clear_dtensor_caches()
            live = [e for e in self._entries if e.live and e.variant is not None]
            self._salt.set(",".join(f"torch_overlay:{e.patch.id}@{_short_hash(e.variant.text)}" for e in live))
        except Exception as exc:  # noqa: BLE001 - runs inside an import: never break it
            if self.config.strict:
                raise
            message = f"torch_overlay: could not refresh torch's caches after a patch ({type(exc).__name__}: {exc})"
            _warn(message, stacklevel=4)

    # ---------------------------------------------------------------- revert
    def revert(self) -> list[str]:
        """Undo what can be undone in this process; return what needs a new process, one line each.

        Swapped code is restored. A module that executed its patched source at import keeps it
        (its functions were never anything else); its component stays as it is, so that a
        multi-file patch is never left half applied.
        """
        needs_restart: list[str] = []
        with self._lock:
            touched: list[str] = []
            components = {id(e.component): e.component for e in self._entries if e.component is not None}
            for component in components.values():
                if any(e.at_import for e in component.entries):
                    for entry in component.entries:
                        if entry.state in (PatchState.APPLIED, PatchState.PENDING) and entry.changes:
                            needs_restart.append(
                                f"{entry.patch.id}: applied at import of {', '.join(sorted(entry.changes))}; "
                                f"start a new process with TORCH_OVERLAY_DISABLE={entry.patch.id} to run without it"
                            )
                    continue
                component.reverted = True
                for entry in reversed(component.entries):
                    for plan in reversed(entry.plans):
                        plan.revert()
                        touched.append(plan.module.__name__)
                    entry.plans, entry.swapped = [], set()
                    if entry.state in (PatchState.APPLIED, PatchState.PENDING):
                        entry.state, entry.reason = PatchState.DISABLED, "reverted by torch_overlay.revert()"
            self._hook.watch({n for n, c in self._by_module.items() if not c.reverted})
            if touched:
                self._after_change(touched)
            else:
                self._after_change([])
        for line in needs_restart:
            log.info("torch_overlay.revert(): %s", line)
        return needs_restart

    # ---------------------------------------------------------------- report
    def _set(self, entry: _Entry, state: PatchState, reason: str) -> None:
        entry.state, entry.reason = state, reason
        if state in (PatchState.DRIFT, PatchState.FAILED):
            if entry.warned:
                return
            entry.warned = True
            message = f"torch_overlay: patch {entry.patch.id} {state}: {reason}; torch is left unpatched"
            _warn(message, stacklevel=4)
        else:
            log.debug("patch %s: %s (%s)", entry.patch.id, state, reason)

    def _maybe_log_summary(self) -> None:
        if self._summary_logged or any(e.state == PatchState.PENDING for e in self._entries):
            return
        self._summary_logged = True
        if os.environ.get("RANK", "0") != "0":
            return
        counts: dict[str, list[str]] = {}
        for e in self._entries:
            counts.setdefault(str(e.state), []).append(e.patch.id)
        parts = "; ".join(f"{state}: {', '.join(ids)}" for state, ids in counts.items())
        log.info("torch_overlay on torch %s: %s", torch_version(), parts)

    def status(self) -> list[PatchStatus]:
        with self._lock:
            out = []
            for e in self._entries:
                main = e.variant or e.patch.main
                out.append(
                    PatchStatus(
                        id=e.patch.id,
                        title=main.title if main else "",
                        bug=main.fields.get("Bug", "") if main else "",
                        targets=tuple(e.targets or e.patch.targets),
                        state=e.state,
                        reason=e.reason,
                        variant=e.variant.path.name if e.variant else "",
                        mode=self._mode(e),
                    )
                )
            return out

    def patches(self) -> list[Patch]:
        return [e.patch for e in self._entries]

    def module_text(self, module: str) -> str | None:
        """The source ``module`` runs (or will run) with the overlay; None until its patches are decided."""
        with self._lock:
            component = self._by_module.get(module)
            if component is None or not component.decided:
                return None
            path = next(p for p, t in component.targets.items() if t.module == module)
            return component.texts.get(path)

    # ------------------------------------------------------ is_patched & co
    def _patched_codes(self) -> dict[int, tuple[types.CodeType, _Entry | None, str]]:
        """id(code) -> (code, entry of a swap or None, module) for every code object a patch changed."""
        out: dict[int, tuple[types.CodeType, _Entry | None, str]] = {}
        for entry in self._entries:
            for plan in entry.plans:
                for _, _, new in plan.swaps:
                    out[id(new)] = (new, entry, plan.module.__name__)
        for component in {id(c): c for c in self._by_module.values()}.values():
            for name, plan in component.modules.items():
                if plan.code is not None and name in sys.modules:
                    for code in plan.code.patched_codes():
                        out[id(code)] = (code, None, name)
        return out

    def is_patched(self, obj: object) -> bool:
        """Whether ``obj`` (a function, method or class) runs code a patch changed."""
        with self._lock:
            codes = self._patched_codes()
            if isinstance(obj, type):
                component = self._by_module.get(obj.__module__)
                plan = component.modules.get(obj.__module__) if component else None
                if plan is not None and plan.code is not None:
                    if any(obj.__qualname__ in names for names in plan.code.changed.values()):
                        return True
            return any(id(c) in codes for c in codes_of(obj))

    def get_original(self, obj: Any) -> Any:
        """The function as torch ships it: ``obj`` itself when no patch changed it."""
        fn = getattr(obj, "__func__", obj)
        code = getattr(fn, "__code__", None)
        found = self._patched_codes().get(id(code)) if code is not None else None
        if found is None:
            return obj
        _, entry, module = found
        original: types.CodeType | None = None
        if entry is not None:
            original = next(old for plan in entry.plans for f, old, new in plan.swaps if new is code)
        else:
            component = self._by_module[module]
            plan = component.modules[module]
            unpatched = compile(plan.base, _installed_name(plan.file), "exec", dont_inherit=True)
            original = find_code(unpatched, code.co_qualname)
        if original is None or original.co_freevars != code.co_freevars:
            raise ValueError(f"{code.co_qualname}: the patch added it; torch has no original")
        return with_code(fn, original)

