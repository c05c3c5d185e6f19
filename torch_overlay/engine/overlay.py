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
from collections.abc import Callable, MutableMapping
from typing import Any, TYPE_CHECKING

from .._config import Config, load_config, unknown_ids_problem
from .._state import Mode, OverlayError, PatchState, PatchStatus
from ..series.series import Patch, SeriesError
from ..series.versions import torch_installed, torch_version

# Only what activation needs is imported here: `import torch_overlay` is on the path of every
# job's `import torch` (README, Benchmarks); the rest is imported where it is first used.
from .caches.activation_memo import recall_activation, settle_and_group
from .caches.series_index import folder_key, indexed_series_and_key
from .components import Component, Entry
from .importhook import ImportHook
from .other_torch import left_to_another_torch
from .job_lines import JobVoice, late_warning, summary_line
from .roster import Roster
from .once_per_job import says, warn

if TYPE_CHECKING:
    from .caches.folder import CacheFolder
    from .import_failures import FailedImports
    from .invalidate import CompileCacheSalt
    from .reach import Reach

__all__ = ["Overlay", "process_overlay"]

log = logging.getLogger("torch_overlay")


class Overlay:
    def __init__(self, config: Config | None = None) -> None:
        # Only the process's own overlay (switches from os.environ) tells its children what it said.
        self._environ: MutableMapping[str, str] | None = os.environ if config is None else None
        self.config = config or load_config()
        self._lock = threading.RLock()
        self._roster = Roster([], [], [])
        self._by_module: dict[str, Component] = {}
        self._hook = ImportHook(self._provide, self._fallback)
        self._salt_writer: CompileCacheSalt | None = None
        self._cache_folder: CacheFolder | None = None
        self._activated = False
        self._summary_logged = False
        # The job's lines (which torch and fixes, then which were applied): the process's own
        # overlay only, said by one process of a job (engine/once_per_job.py); the CLI turns them off.
        self.job = JobVoice(
            self._environ,
            self.config.enabled and not self.config.quiet,
            self._lock,
            lambda: self._roster,
            lambda: None if self.reach is None else self.reach.report(),
        )
        self.problems: list[str] = []  # the series or a switch could not be read as given
        # Made when a module's patched code first raises (rare: its module is imported only then).
        self._imports: FailedImports | None = None
        self._late: list[Entry] = []  # lost to a late import, not yet warned about (one warning for all)
        self.reach: Reach | None = None  # TORCH_OVERLAY_REACH=1: how often each fix's changed code ran

    @property
    def _cache(self) -> CacheFolder:
        """The cache folder (engine/caches/), made when the overlay first reads or writes it."""
        if self._cache_folder is None:
            from .caches.folder import CacheFolder

            self._cache_folder = CacheFolder.of(self.config)
        return self._cache_folder

    @property
    def _salt(self) -> CompileCacheSalt:
        if self._salt_writer is None:
            from .invalidate import CompileCacheSalt

            self._salt_writer = CompileCacheSalt(self._hook)
        return self._salt_writer

    # ----------------------------------------------------------------- setup
    def activate(self) -> None:
        """Read the series and watch the target modules; decide at once those already imported."""
        with self._lock:
            if self._activated:
                return
            self._activated = True
            if not torch_installed():  # nothing to patch: `explain` and the tools still work
                return
            patches: list[Patch]
            key, patches, recalled = None, [], None
            folder, cache = self.config.patches_dir, self._cache
            try:
                # The folder's index key, once: a cold activation reads the series under it too.
                known = folder_key(folder) if cache.usable else None
                recalled = recall_activation(folder, self.config, cache, known[0]) if known else None
                if recalled is None:
                    patches, key = indexed_series_and_key(folder, cache, known)
            except SeriesError as exc:
                self.report_problem(str(exc))
            for problem in self.config.problems:
                self.report_problem(problem)
            ids = recalled[0].ids if recalled else [p.id for p in patches]
            unknown = unknown_ids_problem(self.config.disabled_ids, set(ids))
            if unknown and ids:
                self.report_problem(unknown)
            if recalled:
                self._roster, settled = recalled
                for entry, state, reason in settled:
                    self._set(entry, state, reason)
            else:
                entries = [Entry.of(p) for p in patches]
                components = settle_and_group(entries, key, self.config, self._cache, self._set)
                self._roster = Roster.of(entries, components)
            for component in self._roster.components:
                for target in component.targets.values():
                    self._by_module[target.module] = component
            self._watch()
            if cache.counting:  # the counted code's check of Dynamo, once torch.compiler exists
                from .reach_counter import install

                self._hook.on_import("torch.compiler", lambda _: install())
            for component in {id(c): c for c in self._by_module.values()}.values():
                if any(t.module in sys.modules for t in component.targets.values()):
                    self._decide(component, importing=None, warn_late=False)
            self._warn_late()  # one warning for every component a late import cost
            _raise_if_strict(self.config, self._roster.made())
            self._maybe_log_summary()
            self.job.claim_exit_line()
            if any(t in sys.modules for t in self._by_module):
                self.job.start()

    def report_problem(self, message: str) -> None:
        """Warn about something the overlay cannot do as configured, once per job (raise under strict)."""
        self.problems.append(message)
        text = f"torch_overlay: {message}"
        if self.config.strict:
            raise OverlayError(text)
        if says(text, self._environ):
            warn(text)

    def _watch(self) -> None:
        names = set(self._by_module)
        self._hook.watch(names)
        for name in names:
            self._hook.on_import(name, self._on_imported)

    # ------------------------------------------------------------ decisions
    def _decide(self, component: Component, importing: str | None, warn_late: bool = True) -> None:
        """Decide ``component`` (see :mod:`.decider`) and record each entry's outcome; ``warn_late``:
        say now what a late import cost (else the caller does, for several components at once)."""
        from .decider import decide_component

        outcomes, imported = decide_component(component, importing, torch_version(), self._cache)
        for entry in component.entries:
            outcome = outcomes.get(id(entry))
            if outcome is None:
                continue
            entry.variant = outcome.variant
            if outcome.state != PatchState.APPLIED:
                self._set(entry, outcome.state, outcome.reason, outcome.late)
                continue
            entry.changes = {component.targets[p].module for p in outcome.paths}
            entry.swapped = entry.changes & imported
            entry.reason = outcome.reason
            self._update(entry)
        if self.reach is not None:
            self.reach.watch_swaps(component.entries)
        if any(e.swapped for e in component.entries):
            self._after_change(sorted({m for e in component.entries for m in e.swapped}))
        if warn_late:
            self._warn_late()

    def _warn_late(self) -> None:
        """One warning for the patches lost to a late import since the last one (each rank that lost
        them says it: what a rank imported first depends on the code it ran)."""
        lost, self._late = self._late, []
        if lost:
            message = late_warning(lost)
            if says(message, self._environ, per_rank=True):
                warn(message)

    def _update(self, entry: Entry) -> None:
        self._set(entry, *_settled(entry))

    # ----------------------------------------------------------- import hook
    def _provide(self, module: types.ModuleType) -> tuple[types.CodeType, Callable[[], str]] | None:
        """The code ``module`` runs and what gives its text (its patched source), or None for its own."""
        name = module.__name__
        with self._lock:
            component = self._by_module.get(name)
            if component is None or component.reverted or left_to_another_torch(component.entries, self):
                return None
            if not component.decided:
                self._decide(component, importing=name)
            _raise_if_strict(self.config, component.entries)
            if self._imports is not None:
                self._imports.new_try(name)
            from .decider import plan_for_import

            plan, ready = plan_for_import(component, module, self._cache)
            if plan is None:
                return None
            if not ready:
                for entry in plan.entries:
                    self._set(
                        entry, PatchState.FAILED, f"{plan.target.path} changed on disk since the patch was decided"
                    )
                _raise_if_strict(self.config, plan.entries)
                return None
            assert plan.code is not None
            plan.code.register_source()
            if self.reach is not None:
                self.reach.watch_module(plan.code)
            code = plan.code
            return code.code, lambda: code.text

    def _on_imported(self, name: str) -> None:
        """After a watched module executed: record which patches it now runs."""
        with self._lock:
            component = self._by_module.get(name)
            if component is None or not component.decided:
                return
            if self._imports is not None and self._imports.own_code_ran(component, name):  # the patch failed
                return
            plan = component.modules.get(name)
            if plan is None:
                return
            for entry in plan.entries:
                if entry.state in (PatchState.PENDING, PatchState.APPLIED) and name in entry.changes:
                    entry.at_import = entry.at_import | {name}
                    self._update(entry)
            self._after_change([name])
            self._maybe_log_summary()
        self.job.start()

    def _fallback(self, module: types.ModuleType, exc: BaseException) -> bool:
        """The patched source raised while the module executed: its own code runs (:mod:`.import_failures`)."""
        retry = not self.config.strict and not isinstance(exc, (KeyboardInterrupt, SystemExit))
        with self._lock:
            if self._imports is None:
                from .import_failures import FailedImports

                self._imports = FailedImports(lambda entry, why: self._set(entry, PatchState.FAILED, why))
            self._imports.patched_code_raised(self._by_module.get(module.__name__), module.__name__, exc, retry)
        return retry

    def _after_change(self, modules: list[str]) -> None:
        from .invalidate import refresh_after_change

        refresh_after_change(modules, self._roster.made(), lambda: self._salt, self.config.strict)

    def on_import(self, module: str, callback: Callable[[str], object]) -> None:
        """Call ``callback(module)`` each time ``module`` has been imported (after its code ran)."""
        self._hook.on_import(module, callback)

    def count_reach(self) -> None:
        """Count how often each applied fix's changed functions run from now on (:mod:`.reach`)."""
        from .reach import DUMP_DIR, Reach

        self.reach = Reach(self._roster.made).watch_live(self._roster.components)
        if os.environ.get(DUMP_DIR):  # a process compare's reach plugin started for a test
            from .reach_ranks import install

            install(self.reach, self.on_import)

    # ---------------------------------------------------------------- revert
    def revert(self) -> list[str]:
        """Undo what can be undone in this process; return what needs a new process, one line each."""
        with self._lock:
            from .revert import revert_components

            touched, needs_restart = revert_components(self._roster.components)
            self._hook.watch({n for n, c in self._by_module.items() if not c.reverted})
            self._after_change(touched)
        for line in needs_restart:
            log.info("torch_overlay.revert(): %s", line)
        return needs_restart

    # ---------------------------------------------------------------- report
    def _set(self, entry: Entry, state: PatchState, reason: str, late: str = "") -> None:
        entry.state, entry.reason, entry.late = state, reason, late
        if state in (PatchState.DRIFT, PatchState.FAILED):
            if entry.warned:
                return
            entry.warned = True
            if late:  # said with the others it cost, once (:meth:`_warn_late`)
                self._late.append(entry)
                return
            warn(f"torch_overlay: patch {entry.id} {state}: {reason}; torch is left unpatched")
        else:
            log.debug("patch %s: %s (%s)", entry.id, state, reason)

    def _maybe_log_summary(self) -> None:
        roster = self._roster
        if self._summary_logged or roster.unmade() or any(e.state == PatchState.PENDING for e in roster.made()):
            return
        self._summary_logged = True
        if os.environ.get("RANK", "0") == "0":
            log.info("%s", summary_line(roster.made(), torch_version()))

    def status(self) -> list[PatchStatus]:
        with self._lock:
            return [_status_row(e) for e in self._roster.every()]

    def patches(self) -> list[Patch]:
        with self._lock:
            return [e.patch for e in self._roster.every()]

    def module_text(self, module: str) -> str | None:
        """The source ``module`` runs (or will run) with the overlay; None until its patches are decided."""
        with self._lock:
            component = self._by_module.get(module)
            if component is None or not component.decided:
                return None
            from .decider import texts_of

            path = next(p for p, t in component.targets.items() if t.module == module)
            return texts_of(component).get(path)

    # ------------------------------------------------------ is_patched & co
    def is_patched(self, obj: object) -> bool:
        """Whether ``obj`` (a function, method or class) runs code a patch changed."""
        with self._lock:
            from . import originals

            return originals.is_patched(obj, self._roster.made(), self._by_module)

    def get_original(self, obj: Any) -> Any:
        """The function as torch ships it: ``obj`` itself when no patch changed it."""
        with self._lock:
            from . import originals

            return originals.get_original(obj, self._roster.made(), self._by_module)


_process: Overlay | None = None


def process_overlay() -> Overlay:
    """This process's overlay (switches from ``os.environ``): the one ``import torch_overlay``
    activates and the CLI reads; made on first use, not activated here."""
    global _process
    if _process is None:
        _process = Overlay()
    return _process


def _settled(entry: Entry) -> tuple[PatchState, str]:
    """APPLIED once every module the patch changes runs it; PENDING (decided) until then."""
    waiting = sorted(entry.changes - entry.swapped - entry.at_import)
    if waiting:
        return PatchState.PENDING, f"applies at import of {', '.join(waiting)}"
    component = entry.component
    changed: list[str] = []
    for name in sorted(entry.changes):
        if name in entry.swapped:
            changed += [q for plan in entry.plans if plan.module.__name__ == name for q in plan.changed]
        elif component is not None and name in component.modules and (code := component.modules[name].code):
            changed += code.changed.get(entry.id, [])
    name = entry.variant.name if entry.variant else ""
    return PatchState.APPLIED, f"{name}: {', '.join(dict.fromkeys(changed)) or 'new definitions'}"


def _raise_if_strict(config: Config, entries: list[Entry]) -> None:
    """Under TORCH_OVERLAY_STRICT=1, the first drifted or failed patch of ``entries`` raises."""
    if not config.strict:
        return
    for entry in entries:
        if entry.state in (PatchState.DRIFT, PatchState.FAILED):
            raise OverlayError(f"torch_overlay: patch {entry.id} {entry.state}: {entry.reason}")


def _mode(entry: Entry) -> str:
    if entry.state != PatchState.APPLIED:
        return ""
    if entry.swapped and entry.at_import:
        return str(Mode.MIXED)
    return str(Mode.SWAPPED if entry.swapped else Mode.AT_IMPORT)


def _status_row(e: Entry) -> PatchStatus:
    main = e.variant or e.patch.main
    return PatchStatus(
        id=e.id,
        title=main.title if main else "",
        bug=main.field("Bug") if main else "",
        targets=tuple(e.targets or e.patch.targets),
        state=e.state,
        reason=e.reason,
        variant=e.variant.name if e.variant else "",
        late=e.late,
        mode=_mode(e),
    )
