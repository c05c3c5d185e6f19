"""Code outside ``torch_overlay/engine/`` uses the engine through its public names only.

The rule, per module of the package outside ``engine/`` (and of ``benchmarks/``), read with ``ast``:
a name is *the engine's* when it is bound to ``torch_overlay`` itself, to a name imported from the
package root or from an engine module, to a variable or parameter annotated with such a name, or to
a value reached from one (``x = engine_name.attr``, ``x = engine_name(...)``, ``for x in engine_name...``,
``with engine_name(...) as x``). Reading an attribute whose name starts with ``_`` (dunders aside)
on an expression rooted at such a name is an offence, and so is importing a ``_`` name from the root
or an engine module. Code inside strings that import torch_overlay (a probe run in a fresh Python)
counts too. Names are tracked per module without regard to scope: a name once the engine's is the
engine's everywhere in that module (rename the other one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_overlay"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_engine_module(module: str) -> bool:
    return module == "torch_overlay" or module == "torch_overlay.engine" or module.startswith("torch_overlay.engine.")


def _root(node: ast.AST) -> str | None:
    """The name an attribute, call or subscript chain starts from (``a`` of ``a.b(c)[d].e``)."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (``a``, ``a, b``, ``[a, *b]``)."""
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _annotation_names(annotation: ast.AST | None) -> set[str]:
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval")
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}


def _engine_names(tree: ast.AST, package: str) -> set[str]:
    """Every name of the module that is the engine's (see the module docstring), to a fixed point."""
    engine: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch_overlay" and (
                    alias.asname is None or _is_engine_module(alias.name)
                ):
                    engine.add(alias.asname or "torch_overlay")
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            if _is_engine_module(module):
                engine.update(alias.asname or alias.name for alias in node.names)
            elif module == "torch_overlay" or module.startswith("torch_overlay."):
                # `from torch_overlay.engine import overlay` arrives here as module "torch_overlay.engine"
                engine.update(
                    alias.asname or alias.name for alias in node.names if _is_engine_module(f"{module}.{alias.name}")
                )
    while True:
        before = len(engine)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _root(node.value) in engine:
                for target in node.targets:
                    engine.update(_names(target))
            elif isinstance(node, (ast.AnnAssign, ast.arg)) and _annotation_names(node.annotation) & engine:
                engine.update(_names(node.target) if isinstance(node, ast.AnnAssign) else [node.arg])
            elif isinstance(node, ast.AnnAssign) and node.value is not None and _root(node.value) in engine:
                engine.update(_names(node.target))
            elif isinstance(node, (ast.For, ast.comprehension)) and _root(node.iter) in engine:
                engine.update(_names(node.target))
            elif isinstance(node, ast.withitem) and node.optional_vars and _root(node.context_expr) in engine:
                engine.update(_names(node.optional_vars))
            elif isinstance(node, ast.NamedExpr) and _root(node.value) in engine:
                engine.add(node.target.id)
        if len(engine) == before:
            return engine


def offences(source: str, package: str, where: str) -> list[str]:
    """Each private name of the engine that ``source`` (a module of ``package``) reads, as ``where:line``."""
    tree = ast.parse(source)
    engine = _engine_names(tree, package)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node.value) in engine:
            found.append((node.lineno, f"{where}:{node.lineno}: {ast.unparse(node)}"))
        elif isinstance(node, ast.ImportFrom) and _is_engine_module(_absolute(node, package)):
            found += [(node.lineno, f"{where}:{node.lineno}: imports {a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import torch_overlay" in node.value:
            try:
                found += [(node.lineno, o) for o in offences(node.value, "", f"{where}:{node.lineno} (in a string)")]
            except SyntaxError:
                continue
    return [text for _, text in sorted(found)]


def _modules() -> list[tuple[Path, str]]:
    """(file, its package) of every module outside the engine: the package's and the benchmarks'."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "engine":
            continue
        out.append((path, ".".join(rel.parts[:-1])))
    return out + [(path, "benchmarks") for path in sorted((ROOT / "benchmarks").rglob("*.py"))]


def test_nothing_outside_the_engine_reads_its_private_names():
    found = []
    for path, package in _modules():
        found += offences(path.read_text(), package, str(path.relative_to(ROOT)))
    assert found == [], "private names of the engine read outside it:\n" + "\n".join(found)


def test_the_rule_catches_what_it_should_and_only_that():
    source = """
import torch
import torch_overlay
from torch_overlay.engine.overlay import Overlay, _status_row
from torch_overlay.series.series import Patch
from ..engine import warm as w


def f(overlay: Overlay, patch: Patch):
    torch._inductor.config
    patch._private
    overlay._lock
    ov = torch_overlay._overlay
    for c in ov.components():
        c._cache
    report = w.warm(ov)
    report._x
    torch_overlay.__file__
    return "import torch_overlay; torch_overlay._overlay._by_module"
"""
    found = [line.split(": ", 1)[1] for line in offences(source, "torch_overlay.cli", "m")]
    assert found == [
        "imports _status_row",
        "overlay._lock",
        "torch_overlay._overlay",
        "c._cache",
        "report._x",
        "torch_overlay._overlay",
        "torch_overlay._overlay._by_module",
    ]
