"""Fill the code cache ahead of a job: every patched module compiled before any rank imports it.

The first ``import torch`` after an install or a torch upgrade decides each component and compiles
each patched module (on 2.11.0 that costs several times ``import torch`` itself), in every process
that finds the cache cold: the ranks of a 64-rank job starting together each pay it. ``warm`` does
that work once, without importing any target module: it decides every component still to be
decided (a recalled decision included) and makes sure each planned module's code is in the cache,
so that the job's imports recall their decisions and load compiled code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decider import load_plan_code
from .modcode import load_module_code

if TYPE_CHECKING:
    from .overlay import Overlay

__all__ = ["WarmReport", "warm"]


class WarmReport:
    """What ``warm`` did: modules whose code was compiled now, and those found in the cache."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder  # None: no usable code cache (TORCH_OVERLAY_CODE_CACHE=0, or not writable)
        self.compiled: list[str] = []
        self.cached: list[str] = []
        self.imported: list[str] = []  # decided at activation (a target already imported): nothing kept

    def line(self) -> str:
        if self.folder is None:
            return (
                "no code cache to fill (TORCH_OVERLAY_CODE_CACHE=0, or its folder is not usable): each import compiles"
            )
        total = len(self.compiled) + len(self.cached)
        return (
            f"{total} patched module(s) ready in {self.folder}: {len(self.compiled)} compiled now, "
            f"{len(self.cached)} already there"
        )


def warm(overlay: Overlay) -> WarmReport:
    """Decide every pending component of ``overlay`` and put each planned module's code in the cache."""
    cache = overlay._cache
    usable = cache.usable
    report = WarmReport(str(cache.folder) if usable else None)
    if not usable:
        return report
    with overlay._lock:
        components = {id(c): c for c in overlay._by_module.values()}.values()
        for component in components:
            if component.reverted:
                continue
            if component.decided and not component.remembered:
                # Decided in this process with its files read: its code went to the cache then,
                # unless a module was already imported (its functions were swapped instead).
                report.imported += sorted(component.modules)
                continue
            if not component.decided:
                overlay._decide(component, importing=None)
            for name, plan in sorted(component.modules.items()):
                if plan.code is not None:
                    (report.cached if component.remembered else report.compiled).append(name)
                    continue
                # The check the job's import applies: an entry of the wrong shape is no code.
                plan.code = load_module_code(cache, plan.code_key, plan.file) if plan.code_key else None
                (report.compiled if plan.code is None else report.cached).append(name)
                if plan.code is None:
                    load_plan_code(component, plan, cache)
    return report
