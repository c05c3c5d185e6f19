"""Swap a live module's functions to the code compiled from its patched source.

This is the late path, for a module imported before the overlay: a module imported after it runs
its patched source (see ``_modcode``).

Every function object keeps its identity (aliases, registries and decorators that hold it all see
the fix); only ``__code__`` changes. New top-level statements (helpers, imports) are executed in
the module namespace. Anything else a hunk could change at module level is refused.
"""

from __future__ import annotations

import __future__
import ast
import difflib
import functools
import gc
import inspect
import sys
import linecache
import types
from dataclasses import dataclass, field
from typing import Any, cast, TYPE_CHECKING

from .caches.compiled_code import COUNTED_SWAP_CODE, SWAP_CODE

if TYPE_CHECKING:
    from .caches.folder import CacheFolder

__all__ = ["CodeSwapError", "same_code", "SwapPlan", "plan_swap"]

_MISSING = object()
_NEW_STATEMENTS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
)


class CodeSwapError(Exception):
    """The patched module cannot be applied to the live module by swapping code."""


def _shape(node: object) -> str:
    """``ast.dump``-like text of a module-level statement, leaving out function and lambda bodies.

    Body changes are handled by swapping code; everything else at module level must not change.
    """
    if isinstance(node, ast.AST):
        skip = ("body",) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else ()
        fields = ",".join(f"{k}={_shape(v)}" for k, v in ast.iter_fields(node) if k not in skip)
        return f"{type(node).__name__}({fields})"
    if isinstance(node, list):
        return "[" + ",".join(_shape(item) for item in node) + "]"
    return repr(node)


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Equal bytecode and constants, ignoring file names and line numbers."""
    if (
        a.co_code != b.co_code
        or a.co_names != b.co_names
        or a.co_varnames != b.co_varnames
        or a.co_freevars != b.co_freevars
        or a.co_cellvars != b.co_cellvars
        or a.co_flags != b.co_flags
        or a.co_argcount != b.co_argcount
        or a.co_posonlyargcount != b.co_posonlyargcount
        or a.co_kwonlyargcount != b.co_kwonlyargcount
        or a.co_qualname != b.co_qualname
        or a.co_exceptiontable != b.co_exceptiontable
        or len(a.co_consts) != len(b.co_consts)
    ):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType) and same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _codes_by_qualname(code: types.CodeType) -> dict[str, list[types.CodeType]]:
    """All code objects nested in ``code`` (not ``code`` itself), by qualname, in order."""
    found: dict[str, list[types.CodeType]] = {}

    def walk(c: types.CodeType) -> None:
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                found.setdefault(const.co_qualname, []).append(const)
                walk(const)

    walk(code)
    return found


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]  # type: ignore[attr-defined]
    names: list[str] = []
    for t in targets:
        names.extend(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


@dataclass
class SwapPlan:
    """Everything needed to move one module from its current code to the patched code."""

    module: types.ModuleType
    filename: str  # the name the patched code carries (registered with linecache)
    source: str
    swaps: list[tuple[types.FunctionType, types.CodeType, types.CodeType]] = field(default_factory=list)
    new_statements: list[tuple[types.CodeType, list[str], int]] = field(default_factory=list)
    caches: list[Any] = field(default_factory=list)  # lru_cache wrappers around swapped functions
    changed: list[str] = field(default_factory=list)  # qualnames whose code changed
    _saved_names: list[tuple[str, Any]] = field(default_factory=list)

    def commit(self) -> None:
        """Apply the plan; on any error undo what was done and re-raise."""
        linecache.cache[self.filename] = (
            len(self.source),
            None,
            self.source.splitlines(True),
            self.filename,
        )
        namespace = self.module.__dict__
        done = 0
        try:
            for code, names, _ in self.new_statements:
                self._saved_names.extend((n, namespace.get(n, _MISSING)) for n in names)
                exec(code, namespace)
            for fn, _, new in self.swaps:
                fn.__code__ = new
                done += 1
        except BaseException:
            for fn, old, _ in self.swaps[:done]:
                fn.__code__ = old
            self._restore_names()
            linecache.cache.pop(self.filename, None)
            raise
        for cache in self.caches:
            cache.cache_clear()

    def revert(self) -> None:
        for fn, old, _ in reversed(self.swaps):
            fn.__code__ = old
        self._restore_names()
        for cache in self.caches:
            cache.cache_clear()
        linecache.cache.pop(self.filename, None)

    def _restore_names(self) -> None:
        namespace = self.module.__dict__
        for name, value in reversed(self._saved_names):
            if value is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = value
        self._saved_names.clear()


def _compile_patched(
    module_name: str, old_source: str, new_source: str, filename: str, counted: list[str] | None = None
) -> tuple[types.CodeType, list[tuple[types.CodeType, list[str], int]]]:
    """Compile ``new_source`` and the module-level statements it adds; refuse other changes.
    ``counted``: the functions that count their runs (reach on Python 3.11, engine/reach_counter.py)."""
    try:
        old_tree = ast.parse(old_source)
        new_tree = ast.parse(new_source, filename)
        if counted:
            from .reach_counter import count_runs

            count_runs(new_tree, counted, module_name)
        new_code = compile(new_tree, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise CodeSwapError(f"patched source does not compile: {exc}") from exc

    future_flags = 0
    for node in new_tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                future_flags |= getattr(__future__, alias.name).compiler_flag

    imports: list[ast.stmt] = [
        node
        for node in new_tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__"
    ]

    # Module-level statements: only insertions of defs, classes, imports and assignments.
    added: list[tuple[types.CodeType, list[str], int]] = []
    old_shapes = [_shape(s) for s in old_tree.body]
    new_shapes = [_shape(s) for s in new_tree.body]
    matcher = difflib.SequenceMatcher(a=old_shapes, b=new_shapes, autojunk=False)
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag != "insert":
            line = old_tree.body[i1].lineno if i1 < len(old_tree.body) else len(old_source.splitlines())
            raise CodeSwapError(
                f"the patch changes module-level code of {module_name} near line {line} "
                "(decorators, default values, class bodies or other statements); the runtime "
                "overlay can only change function bodies and add new top-level definitions"
            )
        for stmt in new_tree.body[j1:j2]:
            if not isinstance(stmt, _NEW_STATEMENTS):
                raise CodeSwapError(
                    f"the patch adds a {type(stmt).__name__} statement at line {stmt.lineno} of "
                    f"{module_name}; only defs, classes, imports and assignments can be added"
                )
            # Compiled alone, the statement still needs the module's `from __future__` imports,
            # and the names bound by its imports: CPython compiles `mod.f()` differently when
            # `mod` is an imported name. Under `if False:` they are seen but not executed.
            unit: list[ast.stmt] = (
                [ast.If(test=ast.Constant(False), body=imports, orelse=[]), stmt] if imports else [stmt]
            )
            tree = ast.fix_missing_locations(ast.Module(body=unit, type_ignores=[]))
            code = compile(tree, filename, "exec", flags=future_flags, dont_inherit=True)
            added.append((code, _bound_names(stmt), stmt.lineno))
    return new_code, added


def _compile_patched_cached(
    cache: CacheFolder,
    module_name: str,
    old_source: str,
    new_source: str,
    filename: str,
    counted: list[str] | None = None,
) -> tuple[types.CodeType, list[tuple[types.CodeType, list[str], int]]]:
    """:func:`_compile_patched`, memoized on disk (parsing is the slow part)."""
    record = COUNTED_SWAP_CODE if counted else SWAP_CODE
    key = record.key(sys.version, module_name, filename, old_source, new_source, *(counted or []))

    def check(value: object) -> bool:
        # Code compiled for another module's file is not believed (the key names the file; so must the code).
        code, added = cast("tuple[types.CodeType, list[tuple[types.CodeType, str, str]]]", value)
        return {c.co_filename for c in [code, *(a[0] for a in added)]} == {filename}

    build = lambda: _compile_patched(module_name, old_source, new_source, filename, counted)  # noqa: E731
    return record.load_or_build(cache, key, build, check)


def plan_swap(
    module: types.ModuleType, old_source: str, new_source: str, filename: str, cache: CacheFolder
) -> SwapPlan:
    """Work out, without changing anything, how to make ``module`` run ``new_source``.

    ``old_source`` must be the source the module's live code was compiled from (or was swapped to).
    """
    new_code, added = _compile_patched_cached(cache, module.__name__, old_source, new_source, filename)
    plan = SwapPlan(module, filename, new_source)
    plan.new_statements = list(added)

    # Live functions of this module (each refers to the module namespace as its globals),
    # closures created at run time included, grouped by qualname.
    namespace = module.__dict__
    live: dict[str, list[types.FunctionType]] = {}
    for obj in gc.get_referrers(namespace):
        if type(obj) is types.FunctionType and obj.__globals__ is namespace:
            live.setdefault(obj.__code__.co_qualname, []).append(obj)

    _pair(plan, live, new_code)
    if cache.counting and plan.changed:
        _count_runs(plan, live, old_source, new_source, cache)
    swapped = [fn for fn, _, _ in plan.swaps]

    # Memoized results of a swapped function were computed by the old code.
    if swapped:
        lru_wrapper = type(functools.lru_cache(maxsize=None)(lambda: None))
        ids = {id(fn) for fn in swapped}
        # The class test reads no attribute of a value: isinstance() falls back to ``__class__``,
        # which a deprecated object of the namespace answers with a warning (torch.distributed.reduce_op).
        scopes = [namespace] + [
            vars(v) for v in namespace.values() if issubclass(type(v), type) and v.__module__ == module.__name__
        ]
        plan.caches = [
            w
            for scope in scopes
            for w in list(scope.values())
            if type(w) is lru_wrapper and id(getattr(w, "__wrapped__", None)) in ids
        ]
    return plan


def _pair(plan: SwapPlan, live: dict[str, list[types.FunctionType]], new_code: types.CodeType) -> None:
    """Pair each live function with the patched code of the same qualname (into ``plan``). Several code
    objects may share a qualname (overloads, conditional defs): one equal to the live code means that
    function is unchanged; otherwise the single code that matches no live function replaces it."""
    module = plan.module
    new_codes = _codes_by_qualname(new_code)
    for qualname, fns in live.items():
        candidates = [c for c in new_codes.get(qualname, []) if c.co_flags & inspect.CO_OPTIMIZED]
        if not candidates:
            if "<locals>" in qualname:
                continue  # a closure whose parent no longer creates it; the parent is swapped
            raise CodeSwapError(f"{module.__name__}.{qualname} is not defined by the patched source")
        distinct = {id(fn.__code__): fn.__code__ for fn in fns}.values()
        unmatched_live = [c for c in distinct if not any(same_code(c, n) for n in candidates)]
        if not unmatched_live:
            continue
        unmatched_new = [n for n in candidates if not any(same_code(c, n) for c in distinct)]
        if len(unmatched_new) != 1 or len(unmatched_live) != 1:
            raise CodeSwapError(f"{module.__name__}.{qualname}: cannot tell which definition the patch changes")
        old, new = unmatched_live[0], unmatched_new[0]
        if old.co_freevars != new.co_freevars:
            raise CodeSwapError(
                f"{module.__name__}.{qualname}: the patch changes the variables the function "
                "closes over; it cannot be swapped at run time"
            )
        plan.changed.append(qualname)
        plan.swaps += [(fn, old, new) for fn in fns if fn.__code__ is old]


def _count_runs(
    plan: SwapPlan, live: dict[str, list[types.FunctionType]], old_source: str, new_source: str, cache: CacheFolder
) -> None:
    """Reach on Python 3.11: the functions to swap, now known, compiled again with a counter each
    (engine/reach_counter.py) and paired again: they still differ from the live code, the others not.
    Pairs that would not (a qualname shared by several defs) keep the plain code: reach's profile
    function counts it."""
    from .reach_counter import install

    counted = sorted(plan.changed)
    name = plan.module.__name__
    new_code, _ = _compile_patched_cached(cache, name, old_source, new_source, plan.filename, counted)
    again = SwapPlan(plan.module, plan.filename, plan.source)
    try:
        _pair(again, live, new_code)
    except CodeSwapError:
        return
    if sorted(again.changed) == counted:
        install()  # the counted code reads two builtins: they exist before it can run
        plan.swaps = again.swaps
