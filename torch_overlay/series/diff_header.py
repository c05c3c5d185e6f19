"""What the patch file (read at ``import torch_overlay``) and the hunks (parsed when a patch is
decided) share: the torch path a diff header names, and the error a malformed patch raises. Kept
apart and small: the hunk classes are built only when hunks are parsed."""

from __future__ import annotations

from pathlib import Path

__all__ = ["diff_path", "PatchParseError"]


class PatchParseError(ValueError):
    """A patch file is malformed; names the file and line."""

    def __init__(self, path: Path | str, lineno: int, message: str) -> None:
        super().__init__(f"{path}:{lineno}: {message}")
        self.path = str(path)
        self.lineno = lineno


def diff_path(path: str, lineno: int, source: Path) -> str:
    """The torch-relative path of a ``---``/``+++`` header (``a/torch/x.py`` -> ``torch/x.py``)."""
    path = path.split("\t")[0].strip()
    if path == "/dev/null":
        raise PatchParseError(source, lineno, "creating or deleting files is not supported")
    if path[:2] in ("a/", "b/"):
        path = path[2:]
    if not path.startswith("torch/"):
        raise PatchParseError(source, lineno, f"path {path!r} is outside the torch/ tree")
    return path
