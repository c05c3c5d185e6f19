"""A fix's test as it goes upstream: plumbing removed, merged into the upstream test file."""

from __future__ import annotations

import ast
import re

from . import BuildError

__all__ = ["PLUMBING", "merge_test", "reproducer_names", "strip_plumbing"]

PLUMBING = "# torch_overlay: plumbing"


def strip_plumbing(text: str) -> str:
    """``text`` without the lines marked as overlay plumbing."""
    return "".join(line for line in text.splitlines(keepends=True) if PLUMBING not in line)


def reproducer_names(text: str) -> list[str]:
    """Names of the ``test_*`` functions and methods defined at the top level or in a class."""
    names: dict[str, None] = {}
    for node in ast.parse(text).body:
        defs = node.body if isinstance(node, ast.ClassDef) else [node]
        for item in defs:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test_"):
                names.setdefault(item.name, None)
    return list(names)


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def _is_docstring(index: int, node: ast.stmt) -> bool:
    return index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _bindings(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(bound name, ``import`` statement binding it) for each alias of ``node``."""
    out = []
    for alias in node.names:
        if isinstance(node, ast.Import):
            bound = alias.asname or alias.name.split(".")[0]
            stmt = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        else:
            bound = alias.asname or alias.name
            module = "." * node.level + (node.module or "")
            stmt = f"from {module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        out.append((bound, stmt))
    return out


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [bound for bound, _ in _bindings(node)]
    return []


def _start(node: ast.stmt) -> int:
    """First line of ``node``, decorators included (1-based)."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _leading_imports(tree: ast.Module) -> int:
    """How many statements at the top of ``tree`` are its docstring and imports."""
    n = 0
    while n < len(tree.body) and (
        isinstance(tree.body[n], (ast.Import, ast.ImportFrom)) or _is_docstring(n, tree.body[n])
    ):
        n += 1
    return n


def merge_test(existing: str, ours: str, where: str) -> str:
    """Add the imports and tests of ``ours`` to the upstream test file ``existing``.

    Missing imports go after ``existing``'s leading imports, the rest of ``ours`` (its classes,
    helpers and ``instantiate_*`` calls) before its ``if __name__ == "__main__":`` block.
    """
    ours_tree, old_tree = ast.parse(ours), ast.parse(existing)
    ours_lines, old_lines = ours.splitlines(keepends=True), existing.splitlines(keepends=True)
    head = _leading_imports(ours_tree)
    main = next((n for n in ours_tree.body if _is_main_guard(n)), None)
    rest = [n for n in ours_tree.body[head:] if n is not main]

    old_names = {name for node in old_tree.body for name in _defined(node)}
    # A statement the file already has word for word (a shared constant, say) is not repeated.
    old_dumps = {ast.dump(node) for node in old_tree.body}
    repeated = [node for node in rest if _defined(node) and ast.dump(node) in old_dumps]
    skip = {line for node in repeated for line in range(_start(node), node.end_lineno + 1)}
    rest = [node for node in rest if node not in repeated]
    clashes = sorted({name for node in rest for name in _defined(node)} & old_names)
    if clashes:
        raise BuildError(f"{where} already defines {', '.join(clashes)}: rename them in the fix's test")

    future: list[str] = []
    imports: list[str] = []
    for node in ours_tree.body[:head]:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for bound, stmt in _bindings(node):
            if bound not in old_names:
                (future if stmt.startswith("from __future__") else imports).append(stmt)
            elif stmt in _old_import_stmts(old_tree, bound):
                continue
            elif isinstance(node, ast.Import) and stmt.startswith(f"import {bound}."):
                # `import torch.x.y` binds `torch` like the file's own `import torch...`; it only
                # makes sure the submodule is loaded.
                imports.append(stmt)
            else:
                raise BuildError(f"{where} binds {bound!r} differently from the fix's test ({stmt})")

    # Our statements after the imports, with the comments above them, up to our main guard.
    first = ours_tree.body[head - 1].end_lineno if head else 0
    stop = main.lineno - 1 if main else len(ours_lines)
    kept = [line for n, line in enumerate(ours_lines[first:stop], first + 1) if n not in skip]
    chunk = re.sub(r"\n{4,}", "\n\n\n", "".join(kept)).strip("\n") if rest else ""

    out = list(old_lines)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    old_main = next((n for n in old_tree.body if _is_main_guard(n)), None)
    if chunk and old_main is not None:
        out.insert(old_main.lineno - 1, chunk + "\n\n\n")
    elif chunk:
        out.append("\n\n" + chunk + "\n")
    old_head = _leading_imports(old_tree)
    import_at = old_tree.body[old_head - 1].end_lineno if old_head else 0
    out[import_at:import_at] = [line + "\n" for line in imports]
    if old_tree.body and _is_docstring(0, old_tree.body[0]):
        first_stmt = old_tree.body[0].end_lineno
    else:
        first_stmt = _start(old_tree.body[0]) - 1 if old_tree.body else 0
    out[first_stmt:first_stmt] = [line + "\n" for line in future]
    return "".join(out)


def _old_import_stmts(tree: ast.Module, bound: str) -> list[str]:
    return [
        stmt
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name, stmt in _bindings(node)
        if name == bound
    ]
