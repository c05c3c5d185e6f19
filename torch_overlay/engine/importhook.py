"""A meta path finder for watched modules: their code can be replaced before it runs.

For a watched name the finder asks the finders after it for the spec and wraps its loader in a
:class:`ChainedLoader`. At ``exec_module`` the chained loader asks the hook's ``provide`` for the
code to run (None: the module's own) and puts the original loader back on the spec (pkgutil and
importlib.resources use it). A module that runs replaced code gets, as its ``__loader__`` and on its
spec, a loader whose ``get_source`` returns the text that code was compiled from (what
``inspect`` and ``linecache`` ask a module's loader for: Python 3.11 asks ``__loader__``, 3.13
and 3.12.3+ ask ``__spec__.loader``); for a ``SourceFileLoader`` (every torch module) that is a
``SourceFileLoader`` itself, so everything else is as before. Then the callbacks registered for
that name run. ``importlib.reload`` goes through the finder again, so it gets the
same treatment.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import SourceFileLoader
from types import CodeType, ModuleType
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

__all__ = ["ChainedLoader", "ImportHook", "PatchedSourceFileLoader"]

Provider = Callable[[ModuleType], "tuple[CodeType, Callable[[], str]] | None"]  # code, and what gives its text
Fallback = Callable[[ModuleType, BaseException], bool]


class PatchedSourceFileLoader(SourceFileLoader):
    """A module's own file loader, except that ``get_source`` gives the replaced code's text."""

    def __init__(self, fullname: str, path: str, text: Callable[[], str]) -> None:
        super().__init__(fullname, path)
        self.text = text

    def get_source(self, fullname: str | None = None) -> str | None:
        if fullname is None or fullname == self.name:
            return self.text()
        return super().get_source(fullname)


class ChainedLoader:
    def __init__(self, loader: Any, hook: ImportHook) -> None:
        self.loader = loader
        self._hook = hook
        self._source: tuple[str, Callable[[], str]] | None = None  # (module name, its text) of the replaced code

    def __getattr__(self, name: str) -> Any:
        # get_filename, is_package, get_resource_reader...: the original loader's.
        return getattr(self.loader, name)

    def get_source(self, fullname: str) -> str | None:
        if self._source is not None and self._source[0] == fullname:
            return self._source[1]()
        return self.loader.get_source(fullname)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        provided = self._hook.provide(module)
        if provided is None:
            module.__loader__ = self.loader
            self.loader.exec_module(module)
        else:
            code, self._source = provided[0], (module.__name__, provided[1])
            try:
                exec(code, module.__dict__)
            except BaseException as exc:
                if not self._hook.fallback(module, exc):
                    raise
                # The patched code failed half-way: start over with the module's own code.
                keep = {k: v for k, v in module.__dict__.items() if k.startswith("__") and k.endswith("__")}
                module.__dict__.clear()
                module.__dict__.update(keep)
                self._source = None
                module.__loader__ = self.loader
                self.loader.exec_module(module)
            else:
                if type(self.loader) is SourceFileLoader:
                    patched = PatchedSourceFileLoader(self.loader.name, self.loader.path, provided[1])
                    module.__loader__ = patched
                    if spec is not None:
                        spec.loader = patched
        self._hook.imported(module.__name__)


class ImportHook:
    """Watch module names: replace their code before they run, call back after."""

    # A duck-typed meta path finder: importlib.abc would pull zipfile & co into `import torch_overlay`.
    def __init__(self, provide: Provider, fallback: Fallback) -> None:
        self.provide = provide
        self.fallback = fallback
        self._watched: frozenset[str] = frozenset()
        self._callbacks: dict[str, list[Callable[[str], object]]] = {}
        # Watched or called back: what find_spec looks up for every import of the process.
        self._names: frozenset[str] = frozenset()
        self._busy = threading.local()

    def watch(self, names: set[str] | frozenset[str]) -> None:
        """Names whose code ``provide`` may replace (replaces the previous set)."""
        self._watched = frozenset(names)
        self._names = self._watched | frozenset(self._callbacks)
        self.install()

    def on_import(self, name: str, callback: Callable[[str], object]) -> None:
        """Call ``callback(name)`` each time module ``name`` has executed (a post-import hook)."""
        self._callbacks.setdefault(name, []).append(callback)
        if name not in self._names:
            self._names = self._names | {name}
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
        if fullname not in self._names:
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
        spec.loader = ChainedLoader(spec.loader, self)  # type: ignore[assignment]  # a Loader by duck typing
        return spec
