"""One kind of entry in the cache folder, and the rule every kind follows.

A kind has a name and a version: each key starts with both, so an entry written by another version
of a kind (or by another kind) is never read for it; bump the version when what the kind stores
changes shape. A value loaded is believed only if the kind's ``shape`` accepts it, and a caller's
own ``check`` (what the key cannot say, e.g. that code was compiled for this file); anything else
is thrown away and rebuilt (:mod:`.folder`).

The kinds keyed on files say what the files are by ``stat`` alone, :func:`file_signature`, and are
stored only when :func:`settled`: a file written within ``RACY_NS`` of now may be rewritten within
its file system's timestamp resolution without its signature changing (git's "racily clean" index
entries).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .folder import CacheFolder

__all__ = ["file_signature", "RACY_NS", "Record", "settled"]

T = TypeVar("T")

RACY_NS = 2_000_000_000


class Record:
    """A kind of cache entry: ``Record("series index", 5, shape)``."""

    __slots__ = ("tag", "shape")

    def __init__(self, name: str, version: int, shape: Callable[[Any], bool]) -> None:
        self.tag = f"{name} {version}"
        self.shape = shape

    def __repr__(self) -> str:
        return f"Record({self.tag!r})"

    def key(self, *parts: str) -> str:
        """The key of the entry ``parts`` name (each part one string; they are joined with NUL)."""
        return "\0".join((self.tag, *parts))

    def owns(self, key: str) -> bool:
        """Whether ``key`` is a key of this kind."""
        return key.startswith(self.tag + "\0")

    def parts(self, key: str) -> list[str] | None:
        """The parts :meth:`key` was given for ``key``, or None for a key of another kind."""
        return key.split("\0")[1:] if self.owns(key) else None

    def _believed(self, check: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
        shape = self.shape
        return shape if check is None else lambda value: shape(value) and check(value)

    def load(self, folder: CacheFolder, key: str, check: Callable[[Any], bool] | None = None) -> tuple[Any] | None:
        """``(value,)`` stored under ``key`` if it verifies and is believed; None otherwise."""
        return folder.load(key, self._believed(check)) if self.owns(key) else None

    def has(self, folder: CacheFolder, key: str) -> bool:
        """Whether an entry is stored under ``key`` (not read: :meth:`load` still checks it)."""
        return self.owns(key) and folder.has(key)

    def store(self, folder: CacheFolder, key: str, value: object) -> None:
        """Keep ``value`` (marshal-able) under ``key``; a value not of this kind's shape is not kept
        (it would not be believed)."""
        if self.owns(key) and self.shape(value):
            folder.store(key, value)

    def load_or_build(
        self, folder: CacheFolder, key: str, build: Callable[[], T], check: Callable[[Any], bool] | None = None
    ) -> T:
        """The value believed under ``key``, else ``build()`` (stored)."""
        found = self.load(folder, key, check)
        if found is not None:
            return found[0]
        value = build()
        self.store(folder, key, value)
        return value


def file_signature(file: Path | str) -> tuple[int, int, int, int]:
    """(size, mtime in ns, inode, ctime in ns) of ``file``: a rewrite changes at least one of them
    (``__pycache__`` trusts size and mtime; the ctime, which nobody can set back, also sees an
    in-place rewrite whose mtime was put back with ``os.utime``)."""
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def settled(signatures: list[tuple[int, int, int, int]]) -> bool:
    """Whether no file of ``signatures`` was written or changed within ``RACY_NS`` of now."""
    now = time.time_ns()
    return all(abs(now - t) >= RACY_NS for _, mtime, _, ctime in signatures for t in (mtime, ctime))
