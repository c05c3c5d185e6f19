"""Reach on Python 3.11: a counting statement compiled into each changed function (``TORCH_OVERLAY_REACH=1``).

Python 3.11 has no per-code event (3.12's ``sys.monitoring``), and a profile function is called at
every call of the process. So, when reach is on, the patched code is compiled with one statement at
the start of each function a patch changed (after its docstring, on its first statement's line, so
that no line number moves)::

    if not __torch_overlay_compiling__():
        __torch_overlay_runs__["module:qualname"] += 1

Only those functions pay. Both names are builtins, set by :func:`install` before any counted code
runs. ``__torch_overlay_compiling__`` is ``torch.compiler.is_dynamo_compiling`` once that module is
imported (False in eager; Dynamo folds it to True, so a traced function skips the count without a
graph break or a guard on the counts), a function returning False before. The code cache keeps
counted and uncounted code apart (``CacheFolder.counting``).
"""

from __future__ import annotations

import ast
import builtins
import sys
import types
from collections.abc import Iterable

__all__ = ["RUNS", "COMPILING", "counted_key", "count_runs", "install", "made_by_import", "runs"]

RUNS = "__torch_overlay_runs__"
COMPILING = "__torch_overlay_compiling__"
# Each counter's key starts so: a constant of the counted code that says it is counted, and for what.
_PREFIX = "torch_overlay reach:"


class _Runs(dict[str, int]):
    """Key -> runs; a key not counted yet reads 0 (code loaded from the cache names its keys itself).
    The counting statement's store is dropped while an import runs the function (:func:`made_by_import`)."""

    def __missing__(self, key: str) -> int:
        return 0

    def __setitem__(self, key: str, value: int) -> None:
        if not made_by_import(sys._getframe(1)):
            super().__setitem__(key, value)


def made_by_import(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` or a frame that called it is importlib's: a call made while a module's code
    runs (a registration, a decorator, a table built at import) is a definition's, not a use of the
    fix's code, and it runs in every process that imports the module, whatever it then does."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


runs: dict[str, int] = _Runs()


def _not_compiling() -> bool:
    """Before ``torch.compiler`` is imported nothing is compiled."""
    return False


def install() -> None:
    """Set the builtins the counted code reads (again after ``torch.compiler`` is imported: the overlay
    calls this from its post-import hook, before Dynamo can trace anything)."""
    namespace = builtins.__dict__
    if namespace.get(RUNS) is not runs:
        namespace[RUNS] = runs
    check = getattr(sys.modules.get("torch.compiler"), "is_dynamo_compiling", None)
    namespace[COMPILING] = check if check is not None else _not_compiling


def counted_key(code: types.CodeType) -> str | None:
    """The key ``code`` counts its runs under, or None for code compiled without a counter."""
    if RUNS not in code.co_names:
        return None
    return next((c for c in code.co_consts if type(c) is str and c.startswith(_PREFIX)), None)


def count_runs(tree: ast.Module, qualnames: Iterable[str], module_name: str) -> None:
    """Put the counting statement at the start of each def of ``tree`` named by ``qualnames`` (as
    CPython names them: ``Class.method``, ``f.<locals>.g``), in place."""
    wanted = set(qualnames)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                if qualname in wanted:
                    _count_at_start(child, f"{_PREFIX}{module_name}:{qualname}")
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.stmt, ast.excepthandler)):
                visit(child, prefix)

    visit(tree, "")


def _count_at_start(fn: ast.FunctionDef | ast.AsyncFunctionDef, key: str) -> None:
    body = fn.body
    docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    at = 1 if docstring else 0
    # On the line of the statement it precedes: tracebacks, line events and coverage see no new line.
    place = body[at] if at < len(body) else body[0]
    (stmt,) = ast.parse(f"if not {COMPILING}():\n    {RUNS}[{key!r}] += 1\n").body
    for node in ast.walk(stmt):
        if "lineno" in node._attributes:
            node.lineno = node.end_lineno = place.lineno  # type: ignore[attr-defined]
            node.col_offset = node.end_col_offset = place.col_offset  # type: ignore[attr-defined]
    body.insert(at, stmt)
