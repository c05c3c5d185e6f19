"""The overlay: decides each patch's state for the installed torch and applies it when due."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import _caches
from ._config import Config, load_config
from ._decide import APPLY, decide, UPSTREAM
from ._importhook import PostImportFinder
from ._patchfile import PatchFile
from ._series import Patch, read_series
from ._versions import torch_version

if TYPE_CHECKING:
    from ._codeswap import SwapPlan

__all__ = ["Overlay", "OverlayError", "PatchStatus", "STATES"]

log = logging.getLogger("torch_overlay")

STATES = ("applied", "upstream", "drift", "disabled", "pending", "failed")


class OverlayError(RuntimeError):
    """Raised instead of a warning under ``TORCH_OVERLAY_STRICT=1``."""


class OverlayWarning(UserWarning):
    pass


@dataclass
class PatchStatus:
    id: str
    title: str
    bug: str
    targets: list[str]
    state: str
    reason: str
    variant: str = ""  # file name of the variant that applied / matched

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class _Entry:
    patch: Patch
    state: str = "pending"
    reason: str = ""
    variant: PatchFile | None = None
    plans: list["SwapPlan"] = field(default_factory=list)
    # source text of each module before this patch (restored on revert)
    texts_before: dict[str, str] = field(default_factory=dict)


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Overlay:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or load_config()
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._texts: dict[str, str] = {}  # module -> current (possibly patched) source
        self._finder = PostImportFinder(self._on_imported)
        self._activated = False
        self._summary_logged = False
        self._salt = ""

    # ----------------------------------------------------------------- setup
    def activate(self) -> None:
        """Read the series and hook the target modules (applies at once those already imported)."""
        with self._lock:
            if self._activated:
                return
            self._activated = True
            self._entries = [_Entry(p) for p in read_series(self.config.patches_dir)]
            for entry in self._entries:
                if entry.patch.error:
                    self._set(entry, "failed", f"malformed patch: {entry.patch.error}")
                elif not self.config.enabled:
                    entry.state, entry.reason = "disabled", "TORCH_OVERLAY=0"
                elif entry.patch.id in self.config.disabled_ids:
                    entry.state, entry.reason = "disabled", "TORCH_OVERLAY_DISABLE"
                else:
                    missing = [m for m in entry.patch.targets if m not in sys.modules]
                    entry.reason = "waiting for import of " + ", ".join(missing) if missing else ""
            watched = {m for e in self._pending() for m in e.patch.targets}
            if watched:
                self._finder.watch(watched)
                self._finder.install()
            for entry in self._pending():
                if self._ready(entry, None):
                    self._apply(entry)

    def _pending(self) -> list[_Entry]:
        return [e for e in self._entries if e.state == "pending"]

    # ------------------------------------------------------------ import hook
    @staticmethod
    def _ready(entry: _Entry, just_loaded: str | None) -> bool:
        for name in entry.patch.targets:
            module = sys.modules.get(name)
            if module is None:
                return False
            spec = getattr(module, "__spec__", None)
            if name != just_loaded and getattr(spec, "_initializing", False):
                return False
        return True

    def _on_imported(self, name: str) -> None:
        with self._lock:
            if name == _caches.COMPILER_CONFIG and self._salt:
                _caches.set_compile_cache_salt(self._salt)
            for entry in self._pending():
                if name in entry.patch.targets:
                    if self._ready(entry, name):
                        self._apply(entry)
                    else:
                        missing = [m for m in entry.patch.targets if m not in sys.modules]
                        entry.reason = "waiting for import of " + ", ".join(missing)

    # ----------------------------------------------------------------- apply
    def _source(self, module_name: str) -> tuple[str, Path]:
        module = sys.modules[module_name]
        path = Path(getattr(module, "__file__", "") or "")
        if module_name not in self._texts:
            self._texts[module_name] = path.read_text(encoding="utf-8")
        return self._texts[module_name], path

    def _apply(self, entry: _Entry) -> None:
        try:
            self._try_apply(entry)
        except OverlayError:
            raise
        except Exception as exc:  # noqa: BLE001 - never break the import that triggered us
            self._set(entry, "failed", f"{type(exc).__name__}: {exc}")
        self._maybe_log_summary()

    def _try_apply(self, entry: _Entry) -> None:
        patch = entry.patch
        paths = dict(zip(patch.target_paths, patch.targets))  # torch/x/y.py -> torch.x.y
        sources = {path: self._source(module)[0] for path, module in paths.items()}
        decision = decide(patch, torch_version(), sources)
        entry.variant = decision.variant
        if decision.state != APPLY:
            self._set(entry, "upstream" if decision.state == UPSTREAM else "drift", decision.reason)
            return

        from ._codeswap import plan_swap  # compiling machinery: only once a patch applies

        variant = decision.variant
        new_texts = {paths[p]: t for p, t in decision.texts.items() if t != sources[p]}
        old_texts = {paths[p]: t for p, t in sources.items()}
        tag = f"[torch_overlay:{patch.id}]"
        plans = []
        for module_name, text in new_texts.items():
            _, path = self._source(module_name)
            plans.append(plan_swap(sys.modules[module_name], old_texts[module_name], text, f"{path}{tag}"))
        committed: list[SwapPlan] = []
        try:
            for plan in plans:
                plan.commit()
                committed.append(plan)
            entry.plans, entry.variant = plans, variant
            self._after_change(list(new_texts))
        except BaseException:
            # All or nothing: a patch half applied is worse than none.
            for plan in reversed(committed):
                plan.revert()
            entry.plans = []
            raise
        entry.texts_before = {m: old_texts[m] for m in new_texts}
        self._texts.update(new_texts)
        changed = sorted({q for p in plans for q in p.changed})
        self._set(entry, "applied", f"{variant.path.name}: {', '.join(changed) or 'new definitions'}")

    def _after_change(self, modules: list[str]) -> None:
        if _caches.touches_dtensor(modules):
            _caches.clear_dtensor_caches()
        applied = [e for e in self._entries if e.plans]
        self._salt = ",".join(f"torch_overlay:{e.patch.id}@{_short_hash(e.variant.text)}" for e in applied if e.variant)
        if not _caches.set_compile_cache_salt(self._salt):
            # Salt the config as soon as it is loaded (nothing compiles before that).
            self._finder.watch({*self._finder.watched, _caches.COMPILER_CONFIG})
            self._finder.install()

    # ---------------------------------------------------------------- revert
    def revert(self) -> None:
        """Restore every original code object; later imports are left alone."""
        with self._lock:
            touched: list[str] = []
            for entry in reversed(self._entries):
                if entry.plans:
                    for plan in reversed(entry.plans):
                        plan.revert()
                    self._texts.update(entry.texts_before)
                    touched.extend(entry.texts_before)
                    entry.plans = []
                if entry.state in ("applied", "pending"):
                    entry.state, entry.reason = "disabled", "reverted by torch_overlay.revert()"
            self._finder.uninstall()
            if touched:
                self._after_change(touched)

    # ---------------------------------------------------------------- report
    def _set(self, entry: _Entry, state: str, reason: str) -> None:
        entry.state, entry.reason = state, reason
        if state in ("drift", "failed"):
            message = f"torch_overlay: patch {entry.patch.id} {state}: {reason}; torch is left unpatched"
            if self.config.strict:
                raise OverlayError(message)
            warnings.warn(message, OverlayWarning, stacklevel=2)
            log.warning(message)
        else:
            log.debug("patch %s: %s (%s)", entry.patch.id, state, reason)

    def _maybe_log_summary(self) -> None:
        if self._summary_logged or self._pending():
            return
        self._summary_logged = True
        if os.environ.get("RANK", "0") != "0":
            return
        counts: dict[str, list[str]] = {}
        for e in self._entries:
            counts.setdefault(e.state, []).append(e.patch.id)
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
                        targets=e.patch.target_paths,
                        state=e.state,
                        reason=e.reason,
                        variant=e.variant.path.name if e.variant else "",
                    )
                )
            return out

    def patches(self) -> list[Patch]:
        return [e.patch for e in self._entries]
