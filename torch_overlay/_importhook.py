"""A meta path finder for watched modules: their code can be replaced before it runs.

For a watched name the finder asks the finders after it for the spec and wraps its loader in a
:class:`ChainedLoader`. At ``exec_module`` the chained loader asks the hook's ``provide`` for the
code to run (None: the module's own), puts the original loader back on the module and its spec
(pkgutil, inspect and importlib.resources look at its type), executes, then calls the callbacks
registered for that name. ``importlib.reload`` goes through the finder again, so it gets the same
treatment.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

__all__ = ["ChainedLoader", "ImportHook"]

Provider = Callable[[ModuleType], "CodeType | None"]
Fallback = Callable[[ModuleType, BaseException], bool]


class ChainedLoader:
    def __init__(self, loader: Any, hook: ImportHook) -> None:
        self.loader = loader
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package, get_resource_reader...: the original loader's.
        return getattr(self.loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        code = self._hook.provide(module)
        if code is None:
            self.loader.exec_module(module)
        else:
            try:
                exec(code, module.__dict__)
            except BaseException as exc:
                if not self._hook.fallback(module, exc):
                    raise
                # The patched code failed half-way: start over with the module's own code.
                keep = {k: v for k, v in module.__dict__.items() if k.startswith("__") and k.endswith("__")}
                module.__dict__.clear()
                module.__dict__.update(keep)
                self.loader.exec_module(module)
        self._hook.imported(module.__name__)


class ImportHook:
    """Watch module names: replace their code before they run, call back after."""

    # A duck-typed meta path finder: importlib.abc would pull zipfile & co into `import torch_overlay`.
    def __init__(self, provide: Provider, fallback: Fallback) -> None:
        self.provide = provide
        self.fallback = fallback
        self._watched: frozenset[str] = frozenset()
        self._callbacks: dict[str, list[Callable[[str], None]]] = {}
        self._busy = threading.local()

    @property
    def watched(self) -> frozenset[str]:
        return self._watched | frozenset(self._callbacks)

    def watch(self, names: set[str] | frozenset[str]) -> None:
        """Names whose code ``provide`` may replace (replaces the previous set)."""
        self._watched = frozenset(names)
        self.install()

    def on_import(self, name: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(name)`` each time module ``name`` has executed (a post-import hook)."""
        self._callbacks.setdefault(name, []).append(callback)
        self.install()

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def imported(self, name: str) -> None:
        for callback in list(self._callbacks.get(name, ())):
            callback(name)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self._watched and fullname not in self._callbacks:
            return None
        if getattr(self._busy, "active", False):
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
        if spec.loader is None or not hasattr(spec.loader, "exec_module") or isinstance(spec.loader, ChainedLoader):
            return spec
        spec.loader = ChainedLoader(spec.loader, self)
        return spec
