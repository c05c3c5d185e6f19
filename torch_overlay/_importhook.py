"""Run callbacks right after a watched module finishes executing (a post-import hook).

The finder sits first on ``sys.meta_path``, answers only for watched names, and wraps the
``exec_module`` of the spec another finder returned; the loader object stays the same.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = ["PostImportFinder"]


class PostImportFinder:
    # A duck-typed meta path finder: importlib.abc would pull zipfile & co into `import torch_overlay`.
    def __init__(self, callback: Callable[[str], None]) -> None:
        self._callback = callback
        self._watched: frozenset[str] = frozenset()
        self._busy = threading.local()

    @property
    def watched(self) -> frozenset[str]:
        return self._watched

    def watch(self, names: set[str] | frozenset[str]) -> None:
        self._watched = frozenset(names)

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ):  # type: ignore[no-untyped-def]
        if fullname not in self._watched or getattr(self._busy, "active", False):
            return None
        self._busy.active = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.active = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        callback = self._callback

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback(module.__name__)

        # Per-instance override: the loader keeps its type (inspect and pkgutil rely on it).
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
