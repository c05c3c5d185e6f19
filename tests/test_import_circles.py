"""No two modules of the package import each other, directly or around a loop.

A circle makes the import order matter and hides which module owns a name; a name both sides need
belongs in a module both import downward. Every import counts, those inside functions and under
``TYPE_CHECKING`` too. A package's ``__init__`` is its face, not a room: imports of it are left out.
"""

from __future__ import annotations

from tests.test_layout import PACKAGE, _imports


def _module_of(name: str) -> str | None:
    """The package module (a ``.py`` file, not an ``__init__``) that ``name`` is or lies in."""
    parts = name.split(".")
    while parts:
        if PACKAGE.parent.joinpath(*parts).with_suffix(".py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        targets = {_module_of(name) for _, name in _imports(path)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_circle_finder_finds_a_loop():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    assert _circles(_graph()) == []


def test_the_graph_reads_imports_inside_functions():
    # decide.py imports hunks.py only inside its functions (import cost): still an arrow.
    assert "torch_overlay.series.hunks" in _graph()["torch_overlay.series.decide"]


def test_module_of_resolves_names_and_modules():
    assert _module_of("torch_overlay.series.patchfile.PatchFile") == "torch_overlay.series.patchfile"
    assert _module_of("torch_overlay.series") is None
