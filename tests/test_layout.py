"""The package's folders are roles, and no module imports a module of a role above its own.

From the bottom: the shared vocabulary (``_state``, ``_config``, ``_version``), ``series`` (a patch
series as data), ``engine`` (the overlay in a live process), then what users call (``checks``, ``known``,
``launch``, ``recipes``), the CLI, and the build tools. ``torch_overlay/__init__.py`` is the public
face and may use any of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torch_overlay"
LAYERS = {
    "_state": 0,
    "_config": 0,
    "_version": 0,
    "series": 1,
    "engine": 2,
    "checks": 3,
    "known": 3,
    "launch": 3,
    "recipes": 3,
    "cli": 4,
    "tools": 5,
}


def _role(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "torch_overlay" else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every torch_overlay import in ``path``, at any depth."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names] if not node.module else [module]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in out if m.startswith("torch_overlay")]


def test_no_module_imports_a_role_above_its_own():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts == ("__init__.py",) or rel.parts == ("__main__.py",) or "_bootstrap" in rel.parts:
            continue
        own = LAYERS[rel.parts[0].removesuffix(".py")]
        for line, module in _imports(path):
            role = _role(module)
            if role is not None and role in LAYERS and LAYERS[role] > own:
                wrong.append(f"{rel}:{line} imports {module}")
    assert wrong == []


def test_every_module_is_in_a_role_folder():
    loose = {p.name for p in PACKAGE.glob("*.py")} - {
        "__init__.py",
        "__main__.py",
        "_state.py",
        "_config.py",
        "_version.py",
    }
    assert loose == set()


def test_no_class_is_over_300_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300:
                long.append(f"{path.relative_to(PACKAGE)}: {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
