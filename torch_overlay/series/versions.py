"""Where torch is installed and which version, found without importing torch."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path

__all__ = [
    "find_file",
    "torch_installed",
    "parse_version",
    "SUPPORTED",
    "support_note",
    "torch_moved",
    "torch_root",
    "torch_version",
    "version_from_text",
    "version_in",
]

Version = tuple[int, int, int]

# The torch releases the series is written and measured for (pyproject's dependency says the same).
SUPPORTED = (">=2.11", "<2.16")


# Cached: activation asks the same few versions and specs of every patch (`import torch_overlay`).
@functools.cache
def parse_version(text: str) -> Version:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; missing parts count as 0."""
    m = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


@functools.cache
def torch_root() -> Path:
    """The folder that holds the ``torch`` package (site-packages, or a checkout)."""
    torch = sys.modules.get("torch")
    if torch is not None and (file := getattr(torch, "__file__", None)):
        return Path(file).resolve().parent.parent
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def torch_installed() -> bool:
    """Whether this Python can import torch (found without importing it)."""
    try:
        torch_root()
    except (ImportError, ValueError):  # ValueError: a `torch` in sys.modules without a spec
        return False
    return True


@functools.cache
def torch_version() -> str:
    """The installed torch's ``__version__`` string, read from ``torch/version.py``."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        return str(torch.__version__)
    text = (torch_root() / "torch" / "version.py").read_text(encoding="utf-8")
    version = version_from_text(text)
    if version is None:
        raise ImportError("cannot read torch/version.py")
    return version


def torch_moved() -> str | None:
    """Why the ``torch`` imported is not the one :func:`torch_root` found before it was imported
    (``sys.path`` changed in between), or None (also while torch is not imported)."""
    file = getattr(sys.modules.get("torch"), "__file__", None)
    return _moved(file) if file else None


@functools.cache
def _moved(file: str) -> str | None:
    imported = os.path.dirname(os.path.dirname(os.path.realpath(file)))
    if imported == str(torch_root()):
        return None
    return (
        f"the overlay was set up for torch {torch_version()} in {torch_root()}, but torch "
        f"{getattr(sys.modules['torch'], '__version__', '?')} was imported from {imported} (sys.path changed "
        "after `import torch_overlay`): no patch is applied to it; import torch_overlay after setting sys.path"
    )


def version_from_text(text: str) -> str | None:
    """``__version__`` of a ``version.py`` (``__version__ = '2.13.0+cpu'``, or annotated ``: str``),
    read without a regular expression: compiling one is a measurable part of ``import torch_overlay``."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.split(":")[0].strip() == "__version__":
            value = value.split("#", 1)[0].strip()
            if len(value) > 2 and value[0] == value[-1] and value[0] in "'\"":
                return value[1:-1]
    return None


@functools.cache
def version_in(version: str | Version, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec`` such as ``">=2.11,<2.13"`` (empty: always)."""
    v = parse_version(version) if isinstance(version, str) else version
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.fullmatch(r"(>=|<=|==|!=|>|<)\s*(\S+)", clause)
        if not m:
            raise ValueError(f"bad version clause {clause!r} in {spec!r}")
        op, bound = m.group(1), parse_version(m.group(2))
        ok = {
            ">=": v >= bound,
            "<=": v <= bound,
            ">": v > bound,
            "<": v < bound,
            "==": v[: len(m.group(2).split("."))] == bound[: len(m.group(2).split("."))],
            "!=": v[: len(m.group(2).split("."))] != bound[: len(m.group(2).split("."))],
        }[op]
        if not ok:
            return False
    return True


def support_note(version: str) -> str | None:
    """A sentence when ``version`` is outside the supported releases, else None."""
    if version_in(version, ",".join(SUPPORTED)):
        return None
    oldest, newest = SUPPORTED[0].lstrip(">="), SUPPORTED[1].lstrip("<")
    return (
        f"torch {version} is outside the releases this series supports (>= {oldest}, < {newest}): "
        "each patch is still decided on the files, but none was measured on this release"
    )


def find_file(path: str, module: str) -> Path | None:
    """The file that defines ``module`` (torch-relative ``path``), found without importing anything.

    The deepest package of ``module`` already imported decides (its ``__path__``); with none, the
    folder that holds the ``torch`` package.
    """
    parts = module.split(".")
    rel = path.split("/")
    # os.path, not pathlib: activation looks up every target file (`import torch_overlay`).
    for depth in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:depth]))
        if package is not None and hasattr(package, "__path__"):
            for base in package.__path__:
                candidate = os.path.join(base, *rel[depth:])
                if os.path.isfile(candidate):
                    return Path(candidate)
            return None
    candidate = os.path.join(torch_root(), path)
    return Path(candidate) if os.path.isfile(candidate) else None
