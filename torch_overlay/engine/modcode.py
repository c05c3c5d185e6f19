"""Compile a module's patched source to run as that module's code, and say what each patch changed."""

from __future__ import annotations

import ast
import difflib
import hashlib
import linecache
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .caches.compiled_code import COUNTED_MODULE_CODE, MODULE_CODE, MODULE_LINES

if TYPE_CHECKING:
    from .caches.folder import CacheFolder
    from .caches.record import Record

__all__ = [
    "ModuleCode",
    "compile_module",
    "load_module_code",
    "MODULE_CODE",
    "module_code_key_fits",
    "MODULE_LEVEL",
]

MODULE_LEVEL = "<module>"
# inspect.CO_OPTIMIZED (a function's code), without importing inspect on every `import torch`.
_CO_OPTIMIZED = 0x0001


class ModuleCode:
    """A module's compiled patched code (a plain class: see ``_state``'s docstring)."""

    def __init__(
        self,
        code: types.CodeType,
        changed: dict[str, list[str]],  # patch id -> qualnames its hunks touch (MODULE_LEVEL outside defs)
        filename: str,
        lines: list[str],  # the patched text, as linecache holds it (kept split: splitting is the cost);
        # from the code cache, a _LinesOnDemand
        size: int,  # len() of that text
        key: str = "",  # its entry in the code cache
    ) -> None:
        self.code = code
        self.changed = changed
        self.filename = filename
        self.lines = lines
        self.size = size
        self.key = key

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def __repr__(self) -> str:
        return f"ModuleCode({self.filename!r}, changed={self.changed!r}, key={self.key!r})"

    def register_source(self) -> None:
        """Tracebacks, ``inspect.getsource`` and debuggers read the patched text.

        The code carries the installed file's name (torch compares frames' file names with its
        modules' ``__file__``: ``symbolic_shapes.uninteresting_files`` and the like), so linecache
        holds the patched text under that name. mtime None: ``linecache.checkcache`` keeps the
        entry; ``linecache.clearcache()`` (inductor calls it) puts it back (:func:`_keep_on_clear`).
        The lines come split from the code cache (splitting a module as large as distributed_c10d.py
        at every ``import torch`` cost twice as many instructions as unmarshalling its lines), and
        only when first read (:class:`_LinesOnDemand`).
        """
        entry = (self.size, None, self.lines, self.filename)
        linecache.cache[self.filename] = _REGISTERED[self.filename] = entry
        _keep_on_clear()

    def patched_codes(self) -> list[types.CodeType]:
        """The code objects (functions, methods, classes) some patch changed."""
        names = {q for qs in self.changed.values() for q in qs}
        found: list[types.CodeType] = []

        def walk(code: types.CodeType) -> None:
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    if const.co_qualname in names:
                        found.append(const)
                    walk(const)

        walk(self.code)
        return found

    def changed_functions(self) -> dict[str, list[types.CodeType]]:
        """Patch id -> the code of the functions its hunks touch (what reach watches): not class
        bodies or module-level code, which run once, when the module is executed."""
        by_name: dict[str, list[types.CodeType]] = {}
        for code in self.patched_codes():
            if code.co_flags & _CO_OPTIMIZED:
                by_name.setdefault(code.co_qualname, []).append(code)
        return {pid: [c for q in names for c in by_name.get(q, [])] for pid, names in self.changed.items()}


_FILLING = threading.Lock()


class _LinesOnDemand(list[str]):
    """A patched module's lines, read from the code cache the first time anything reads them.

    linecache's entry must hold a list (``getlines`` returns it as it is), and a module's lines are
    read by a traceback or ``inspect`` in few processes, but were unmarshalled and checked at every
    ``import torch``. Every method of ``list`` reads them first, so the C code behind each sees a
    filled list. Lines that can no longer be read (the entry was deleted since the import) are
    none: a traceback then shows frames without their text, never the installed file's text at the
    patched code's line numbers."""

    __slots__ = ("_read",)

    def __init__(self, read: Callable[[], list[str] | None]) -> None:
        super().__init__()
        self._read: Callable[[], list[str] | None] | None = read

    def _filled(self) -> list[str]:
        read = self._read
        if read is not None:
            lines = read() or []
            with _FILLING:  # two threads' first reads: one fills
                if self._read is not None:
                    self._read = None
                    list.extend(self, lines)
        return self


def _reading_first(name: str) -> Callable[..., object]:
    method = getattr(list, name)

    def reads_first(self: _LinesOnDemand, *args: object, **kwargs: object) -> object:
        return method(self._filled(), *args, **kwargs)

    reads_first.__name__ = name
    return reads_first


for _name, _method in vars(list).items():
    if callable(_method) and _name not in (
        "__new__",
        "__init__",
        "__getattribute__",
        "__init_subclass__",
        "__class_getitem__",
    ):
        setattr(_LinesOnDemand, _name, _reading_first(_name))
del _name, _method


def _qualnames_by_line(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, qualname) of every def and class, as CPython names them."""
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((first, child.end_lineno or child.lineno, qualname))
                visit(child, qualname + ("." if isinstance(child, ast.ClassDef) else ".<locals>."))
            elif isinstance(child, (ast.stmt, ast.excepthandler)):
                visit(child, prefix)

    visit(tree, "")
    return spans


def _changed_qualnames(before: str, after: str, tree: ast.Module) -> list[str]:
    """Innermost def/class around each line ``after`` adds or replaces (or where it deletes)."""
    old, new = before.splitlines(), after.splitlines()
    lines: set[int] = set()
    deleted: set[int] = set()  # lines of ``before`` that ``after`` drops without replacing
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "delete":
            deleted.update(range(i1 + 1, i2 + 1))
        elif tag != "equal":
            lines.update(range(j1 + 1, j2 + 1))
    out: dict[str, None] = {}

    def innermost(numbers: set[int], text: list[str], spans: list[tuple[int, int, str]]) -> None:
        for line in sorted(numbers):
            code = text[line - 1].strip() if line <= len(text) else ""
            if not code or code.startswith("#"):
                continue  # blank lines and comments change no code
            inside = [s for s in spans if s[0] <= line <= s[1]]
            out.setdefault(max(inside, key=lambda s: s[0])[2] if inside else MODULE_LEVEL, None)

    innermost(lines, new, _qualnames_by_line(tree))
    if deleted:  # what held the deleted lines, as ``before`` has it (what follows them may be another def)
        innermost(deleted, old, _qualnames_by_line(ast.parse(before)))
    # A function and closures inside it: the function says it.
    return [q for q in out if not any(q.startswith(f"{p}.<locals>.") for p in out)]


def _build(
    module_name: str, filename: str, base: str, steps: list[tuple[str, str]], counting: bool = False
) -> tuple[types.CodeType, dict, list[str], int]:
    changed: dict[str, list[str]] = {}
    before = base
    tree = None
    for pid, text in steps:
        tree = ast.parse(text, filename)
        changed[pid] = changed.get(pid, []) + [
            q for q in _changed_qualnames(before, text, tree) if q not in changed.get(pid, [])
        ]
        before = text
    assert tree is not None
    if counting:  # reach on Python 3.11: each changed function counts its runs (engine/reach_counter.py)
        from .reach_counter import count_runs

        count_runs(tree, [q for qs in changed.values() for q in qs], module_name)
    text = steps[-1][1]
    return compile(tree, filename, "exec", dont_inherit=True), changed, text.splitlines(True), len(text)


# The linecache entries of the patched modules of this process: file name -> entry.
_REGISTERED: dict[str, tuple[int, None, list[str], str]] = {}


def _keep_on_clear() -> None:
    """Make ``linecache.clearcache()`` keep the patched modules' text (once per process).

    The patched code carries the installed file's name, which is on disk: after a plain clear,
    linecache would read the installed text for code that runs the patched one."""
    clear = linecache.clearcache
    if getattr(clear, "__torch_overlay_keeps__", False):
        return

    def clearcache() -> None:
        clear()
        linecache.cache.update(_REGISTERED)

    clearcache.__torch_overlay_keeps__ = True  # type: ignore[attr-defined]
    clearcache.__doc__ = clear.__doc__
    linecache.clearcache = clearcache


def compile_module(
    cache: CacheFolder, module_name: str, file: Path, base: str, steps: list[tuple[str, str]]
) -> ModuleCode:
    """Code for ``steps[-1]``'s text (each step: a patch id and the text after it), cached on disk."""
    filename = str(file)

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    key = MODULE_CODE.key(sys.version, module_name, filename, digest(base), *(f"{p}:{digest(t)}" for p, t in steps))
    found = load_module_code(cache, key, file)
    if found is not None:
        return found
    code, changed, lines, size = _build(module_name, filename, base, steps, cache.counting)
    record, stored = _stored_as(key, cache)
    record.store(cache, stored, (code, changed, size))
    MODULE_LINES.store(cache, _lines_key(key), lines)
    return ModuleCode(code, changed, filename, lines, size, key)


def _lines_key(key: str) -> str:
    """The key of the lines of the module whose code is stored under the MODULE_CODE ``key``
    (counted code or not: the text is the same)."""
    return MODULE_LINES.key(*(MODULE_CODE.parts(key) or []))


def _stored_as(key: str, cache: CacheFolder) -> tuple[Record, str]:
    """The kind and key the code for ``key`` is stored under: counted code (reach on Python 3.11)
    is a kind of its own, with the same parts; a recalled decision names the plain key either way."""
    if not cache.counting:
        return MODULE_CODE, key
    from .reach_counter import install

    install()  # the counted code reads two builtins: they exist before it can run
    return COUNTED_MODULE_CODE, COUNTED_MODULE_CODE.key(*(MODULE_CODE.parts(key) or []))


def _compiled_for(filename: str, pids: list[str]) -> Callable[[object], bool]:
    """The check of a cache entry of :func:`compile_module` beyond its shape: code compiled from
    ``filename`` for exactly the patches ``pids`` (an entry made for another file is not run)."""
    return lambda value: value[0].co_filename == filename and list(value[1]) == pids  # type: ignore[index]


def module_code_key_fits(key: str, module_name: str, file: Path, pids: list[str]) -> bool:
    """Whether ``key`` is one :func:`compile_module` makes for ``module_name`` at ``file`` from the
    patches ``pids``, in order (a recalled decision names it: engine/caches/decision_record.py)."""
    parts = MODULE_CODE.parts(key)
    head = [sys.version, module_name, str(file)]
    return parts is not None and parts[:3] == head and [p.rpartition(":")[0] for p in parts[4:]] == pids


def load_module_code(cache: CacheFolder, key: str, file: Path) -> ModuleCode | None:
    """The code :func:`compile_module` stored under ``key`` for ``file``, or None when the cache
    lacks it or its lines (or holds code compiled for another file or other patches). The lines
    are read when first used."""
    filename = str(file)
    pids = [p.rpartition(":")[0] for p in (MODULE_CODE.parts(key) or [])[4:]]
    lines_key = _lines_key(key)
    if not MODULE_LINES.has(cache, lines_key):
        return None
    record, stored = _stored_as(key, cache)
    found = record.load(cache, stored, _compiled_for(filename, pids))
    if found is None:
        return None
    code, changed, size = found[0]

    def read() -> list[str] | None:
        lines = MODULE_LINES.load(cache, lines_key)
        return lines[0] if lines is not None else None

    return ModuleCode(code, changed, filename, _LinesOnDemand(read), size, key)
