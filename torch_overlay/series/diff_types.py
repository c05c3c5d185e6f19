"""The pieces of a diff, shared by the patch file that holds it and the hunks that parse and apply it:
a file's hunks, the torch path a diff header names, and the error a malformed patch raises."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .._state import Target

__all__ = ["diff_path", "FileDiff", "Hunk", "PatchParseError"]


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


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    # (tag, text) with tag in " ", "-", "+"; text without its newline.
    lines: tuple[tuple[str, str], ...]
    lineno: int  # line of the "@@" header in the patch file

    def side(self, reverse: bool = False) -> tuple[list[str], list[str]]:
        """Return (lines to find, lines to put instead)."""
        drop, add = ("+", "-") if reverse else ("-", "+")
        before = [t for tag, t in self.lines if tag in (" ", drop)]
        after = [t for tag, t in self.lines if tag in (" ", add)]
        return before, after


@dataclass(frozen=True)
class FileDiff:
    path: str  # repository-relative path, e.g. "torch/distributed/tensor/_api.py"
    hunks: tuple[Hunk, ...]

    @property
    def target(self) -> Target:
        return Target.from_path(self.path)
