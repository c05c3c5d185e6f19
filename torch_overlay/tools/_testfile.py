"""A fix's test as it goes upstream: plumbing removed, version gates resolved, only the fix's
classes and what they use, merged into the upstream test file."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from torch_overlay.series.versions import parse_version

from . import BuildError

__all__ = [
    "GATES_MODULE",
    "PLUMBING",
    "fix_test",
    "merge_test",
    "reproducer_names",
    "resolve_gates",
    "select_classes",
    "strip_plumbing",
]

PLUMBING = "# torch_overlay: plumbing"
# The module of torch-version gates (tests/fixes/_torch_gates.py); never staged.
GATES_MODULE = "_torch_gates"


def strip_plumbing(text: str) -> str:
    """``text`` without the lines marked as overlay plumbing."""
    return "".join(line for line in text.splitlines(keepends=True) if PLUMBING not in line)


def fix_test(text: str, classes: Sequence[str] = (), torch_version: str | None = None) -> str:
    """The test module ``text`` as it goes upstream: plumbing removed, version gates resolved (as
    the newest torch takes them, or ``torch_version``), and when ``classes`` are named, only those
    classes with the module-level names they use."""
    text = resolve_gates(strip_plumbing(text), torch_version)
    return select_classes(text, classes) if classes else text


# ---- torch-version gates (tests/fixes/_torch_gates.py) ----


def _gate_names(tree: ast.Module) -> tuple[dict[str, str], list[ast.ImportFrom]]:
    """Local name -> gate name, and the statements importing them."""
    names: dict[str, str] = {}
    imports = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").rsplit(".", 1)[-1] == GATES_MODULE:
            imports.append(node)
            names.update({a.asname or a.name: a.name for a in node.names})
    return names, imports


def _gate_call(node: ast.AST, gates: dict[str, str], name: str) -> ast.Call | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and gates.get(node.func.id) == name:
        return node
    return None


def _before(call: ast.Call, torch_version: str | None) -> bool:
    if not call.args or not isinstance(call.args[0], ast.Constant):
        raise BuildError(f"line {call.lineno}: a version gate starts with a version string")
    return torch_version is not None and parse_version(torch_version) < parse_version(str(call.args[0].value))


def _fold(node: ast.expr, gates: dict[str, str], torch_version: str | None) -> bool | None:
    """The value of a condition made of ``before()`` gates, ``and``, ``or`` and ``not``, where the
    gates decide it alone; None where they do not."""
    call = _gate_call(node, gates, "before")
    if call is not None:
        return _before(call, torch_version)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = _fold(node.operand, gates, torch_version)
        return None if value is None else not value
    if isinstance(node, ast.BoolOp):
        values = [_fold(v, gates, torch_version) for v in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False an `and`
        if decisive in values:
            return decisive
        if all(v is not None for v in values):
            return not decisive
    return None


def _uses_gate(node: ast.AST, gates: dict[str, str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in gates for n in ast.walk(node))


def _block(lines: list[str], first: int, last: int, indent: int) -> str:
    """Lines ``first``..``last`` (1-based) with ``indent`` columns of indentation removed."""
    out = []
    for line in lines[first - 1 : last]:
        strip = len(line) - len(line.lstrip(" "))
        out.append(line[min(indent, strip) :] if line.strip() else line)
    return "".join(out)


def _resolve_one(text: str, gates: dict[str, str], torch_version: str | None) -> str | None:
    """``text`` with its first gate resolved; None when it has none left."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)

    def replace_lines(first: int, last: int, new: str) -> str:
        return "".join(lines[: first - 1]) + new + "".join(lines[last:])

    for node in ast.walk(tree):
        for dec in getattr(node, "decorator_list", []):
            call = _gate_call(dec, gates, "skip_before")
            if call is None:
                continue
            if _before(call, torch_version):
                raise BuildError(f"line {dec.lineno}: this test is skipped on torch {torch_version}")
            return replace_lines(dec.lineno, dec.end_lineno or dec.lineno, "")
        if isinstance(node, ast.If) and _uses_gate(node.test, gates):
            value = _fold(node.test, gates, torch_version)
            if value is None:
                raise BuildError(
                    f"line {node.lineno}: a version gate must decide its `if` alone (as an operand of and/or/not)"
                )
            if lines[node.lineno - 1].lstrip().startswith("elif"):
                raise BuildError(f"line {node.lineno}: a version gate cannot be an elif")
            header_end = node.test.end_lineno or node.lineno
            if value:
                indent = node.body[0].col_offset - node.col_offset
                new = _block(lines, header_end + 1, node.body[-1].end_lineno or 0, indent)
            elif node.orelse:
                else_line = next(
                    n
                    for n in range(node.orelse[0].lineno - 1, node.body[-1].end_lineno or 0, -1)
                    if lines[n - 1].lstrip().startswith(("else", "elif"))
                )
                if lines[else_line - 1].lstrip().startswith("elif"):
                    raise BuildError(f"line {node.lineno}: a version gate cannot be followed by elif")
                indent = node.orelse[0].col_offset - node.col_offset
                new = _block(lines, else_line + 1, node.orelse[-1].end_lineno or 0, indent)
            else:
                new = ""
            return replace_lines(node.lineno, node.end_lineno or node.lineno, new)
        call = _gate_call(node, gates, "for_torch")
        if call is not None:
            if len(call.args) != 1 or not isinstance(call.args[0], ast.Dict):
                raise BuildError(f"line {call.lineno}: for_torch takes one dict literal")
            table = call.args[0]
            keys = [k.value for k in table.keys if isinstance(k, ast.Constant)]
            if len(keys) != len(table.keys):
                raise BuildError(f"line {call.lineno}: for_torch's keys must be version strings")
            known = [k for k in keys if torch_version is None or parse_version(k) <= parse_version(torch_version)]
            chosen = max(known, key=parse_version)
            segment = ast.get_source_segment(text, table.values[keys.index(chosen)])
            start = sum(len(line) for line in lines[: call.lineno - 1]) + _col(lines[call.lineno - 1], call.col_offset)
            end_line = call.end_lineno or call.lineno
            end = sum(len(line) for line in lines[: end_line - 1]) + _col(lines[end_line - 1], call.end_col_offset or 0)
            return text[:start] + (segment or "") + text[end:]
    return None


def _col(line: str, byte_offset: int) -> int:
    """ast's UTF-8 byte column as a character index into ``line``."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace"))


def resolve_gates(text: str, torch_version: str | None = None) -> str:
    """``text`` with its torch-version gates resolved as on the newest torch (or on ``torch_version``)
    and their import removed; refuses a use of a gate it cannot resolve."""
    gates, _ = _gate_names(ast.parse(text))
    if not gates:
        return text
    while True:
        resolved = _resolve_one(text, gates, torch_version)
        if resolved is None:
            break
        try:
            ast.parse(resolved)
        except SyntaxError as e:
            raise BuildError(f"resolving a version gate leaves invalid Python (line {e.lineno}): {e.msg}") from e
        text = resolved
    tree = ast.parse(text)
    _, imports = _gate_names(tree)
    lines = text.splitlines(keepends=True)
    drop = {n for node in imports for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    text = "".join(line for n, line in enumerate(lines, 1) if n not in drop)
    left = sorted({n.lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id in gates})
    if left:
        raise BuildError(f"line {left[0]}: a version gate used where stage cannot resolve it")
    return text


# ---- one fix's classes and what they use ----


def _uses(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _chains(node: ast.AST) -> set[str]:
    """Dotted attribute chains read in ``node`` (``torch._dynamo.test_case.TestCase``)."""
    out = set()
    for n in ast.walk(node):
        parts = []
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if isinstance(n, ast.Name) and parts:
            out.add(".".join([n.id, *reversed(parts)]))
    return out


def _import_text(node: ast.Import | ast.ImportFrom, kept: list[ast.alias]) -> str:
    """The import statement of ``kept`` aliases, black-formatted."""
    names = [a.name + (f" as {a.asname}" if a.asname else "") for a in kept]
    if isinstance(node, ast.Import):
        return "".join(f"import {name}\n" for name in names)
    head = f"from {'.' * node.level}{node.module or ''} import "
    one_line = head + ", ".join(names)
    if len(one_line) <= 88:
        return one_line + "\n"
    return head + "(\n" + "".join(f"    {name},\n" for name in names) + ")\n"


def _leading_comments(lines: list[str], start: int) -> int:
    """First line (1-based) of the comment block right above line ``start``."""
    while start > 1 and lines[start - 2].lstrip().startswith("#"):
        start -= 1
    return start


def select_classes(text: str, classes: Sequence[str]) -> str:
    """``text`` with only the test ``classes``, the module-level names they use (transitively), the
    statements that register or instantiate them, the imports of those, and the main guard."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body = list(tree.body)
    missing = sorted(set(classes) - {n.name for n in body if isinstance(n, ast.ClassDef)})
    if missing:
        raise BuildError(f"no test class {', '.join(missing)} in the module")
    main = next((n for n in body if _is_main_guard(n)), None)
    docstring = body[0] if body and _is_docstring(0, body[0]) else None
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    stmts = [n for n in body if n not in imports and n is not main and n is not docstring]

    defines = {id(s): set(_defined(s)) for s in stmts}
    uses = {id(s): _uses(s) for s in stmts}
    local = set().union(*defines.values()) if defines else set()

    def used_elsewhere(stmt: ast.stmt) -> bool:
        others = set().union(*(uses[id(s)] for s in stmts if s is not stmt)) | (_uses(main) if main else set())
        return bool(defines[id(stmt)] & others)

    # Statements kept for what they do, not for a name: a registration (`op.register_fake`), an
    # `instantiate_*` call, `X = create_local_tensor_test_class(Y)`. Kept with what they use.
    sinks = {
        id(s)
        for s in stmts
        if isinstance(s, ast.Expr)
        or (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "_")
        or (isinstance(s, (ast.Assign, ast.AnnAssign)) and not used_elsewhere(s))
    }
    needed = set(classes) | (_uses(main) if main else set())
    kept: list[ast.stmt] = []
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if s in kept:
                continue
            if (defines[id(s)] & needed and id(s) not in sinks) or (id(s) in sinks and uses[id(s)] & local & needed):
                kept.append(s)
                needed |= uses[id(s)]
                changed = True
    kept.sort(key=lambda s: s.lineno)

    chains = set().union(*(_chains(s) for s in kept)) | (_chains(main) if main else set())
    out: list[str] = []
    first = _start(body[0]) if body else len(lines) + 1
    out.append("".join(lines[: first - 1]))
    if docstring is not None:
        out.append("".join(lines[docstring.lineno - 1 : docstring.end_lineno]))
    import_text = []
    last_import: ast.stmt | None = None
    for node in imports:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            aliases = list(node.names)
        elif isinstance(node, ast.Import):
            aliases = [
                a
                for a in node.names
                if (a.asname or a.name.split(".")[0]) in needed
                and (a.asname or "." not in a.name or any(c == a.name or c.startswith(a.name + ".") for c in chains))
            ]
        else:
            aliases = [a for a in node.names if (a.asname or a.name) in needed]
        if not aliases:
            continue
        between = lines[last_import.end_lineno : _start(node) - 1] if last_import is not None else []
        if any(not line.strip() for line in between):
            import_text.append("\n")  # the blank line between groups (standard library, others)
        if aliases == list(node.names):
            import_text.append("".join(lines[_start(node) - 1 : node.end_lineno]))
        else:
            import_text.append(_import_text(node, aliases))
        last_import = node
    out.append("".join(import_text))
    previous = None
    for s in kept:
        start = _leading_comments(lines, _start(s))
        if previous is not None and stmts.index(s) == stmts.index(previous) + 1 and previous.end_lineno:
            gap = "".join(lines[previous.end_lineno : start - 1])
            out.append(gap if gap.strip() == "" else "\n\n")
        else:
            out.append("\n\n")
        out.append("".join(lines[start - 1 : s.end_lineno]))
        previous = s
    if main is not None:
        out.append("\n\n" + "".join(lines[_leading_comments(lines, main.lineno) - 1 : main.end_lineno]))
    result = "".join(out)
    return re.sub(r"\n{4,}", "\n\n\n", result).rstrip("\n") + "\n"


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
    skip = {line for node in repeated for line in range(_start(node), (node.end_lineno or node.lineno) + 1)}
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
    first = (ours_tree.body[head - 1].end_lineno or 0) if head else 0
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
