"""The series as activation needs it, kept in the code cache like ``__pycache__`` keeps bytecode.

``import torch_overlay`` needs, of each patch file, its id, subject, the fields that say whether it
applies to the installed torch (``INDEXED_FIELDS``; the others are read from the file when used),
the files its diff changes and a digest of its text (a decision and the compile caches' salt are
keyed on it). Reading and parsing every patch file for that cost more than anything else the
overlay adds to ``import torch``, and grew with the series. The index holds exactly that in a code
cache entry (written atomically, in a private folder, checked before use: :mod:`.folder`): each
patch's rows, marshalled apart under its id, so that a process makes only the patches it uses
(:class:`IndexedPatches`). Its key is made of what ``stat`` says of each entry of the series folder
(name, size, mtime, inode, ctime): a patch edited, added, removed or renamed changes the key, and
the series is read again. Nothing in it is executed, and rows that are not exactly the expected
shape are not believed: the series is read from its files, and indexed again (also when the
activation memo is recalled: a damaged index costs one process a read of the series, not every one).

A patch's text is read only when it is needed (:class:`~..series.patchfile.PatchFile`): its hunks,
when a component is decided; its description and ``Error:`` lines for ``status`` or a hint.
"""

from __future__ import annotations

import os
import time
from itertools import repeat
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ..._version import __version__
from ...series.patchfile import INDEXED_FIELDS, KNOWN_FIELDS, MULTI_FIELDS, PatchFile
from ...series.series import Patch, read_series, SeriesError
from . import record
from .record import Record

if TYPE_CHECKING:
    from .folder import CacheFolder

__all__ = [
    "folder_key",
    "IndexedPatches",
    "indexed_series_and_key",
    "read_indexed_series",
    "series_key",
    "SERIES_INDEX",
]

_INDEXED = frozenset(INDEXED_FIELDS)


def series_key(patches_dir: Path) -> tuple[str, bool]:
    """The index key of the series folder, from ``stat`` alone, and whether it may be stored now
    (no entry was changed within the last ``RACY_NS``). Raises ``OSError`` for no such folder."""
    import hashlib
    import marshal
    from bisect import bisect_right
    from operator import attrgetter

    now = time.time_ns()
    folder = os.path.abspath(patches_dir)
    names = sorted(os.listdir(folder))
    # At C speed, no bytecode per file: this runs at every import, for every file of the series.
    stats = map(os.stat, map((folder + os.sep).__add__, names))
    signatures = list(map(attrgetter("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns"), stats))
    # A write sets the mtime to the clock's now, so the mtimes alone say whether it is racy
    # (record.settled, at C speed): whether one lies within RACY_NS of now, either side.
    racy_ns = record.RACY_NS
    mtimes = sorted([mtime for _, mtime, _, _ in signatures])
    later = bisect_right(mtimes, now - racy_ns)
    racy = later < len(mtimes) and mtimes[later] < now + racy_ns
    digest = hashlib.sha256(marshal.dumps((names, signatures))).hexdigest()
    return SERIES_INDEX.key(__version__, ",".join(KNOWN_FIELDS + MULTI_FIELDS), folder, digest), not racy


def folder_key(patches_dir: Path) -> tuple[str, bool] | None:
    """:func:`series_key`, or None where the folder cannot be listed (reading the series says why)."""
    try:
        return series_key(patches_dir)
    except OSError:
        return None


def read_indexed_series(patches_dir: Path, cache: CacheFolder) -> list[Patch]:
    """The series of ``patches_dir`` as :func:`~..series.series.read_series` (``lazy``) gives it:
    from the index when it matches the folder, else read from the files (and indexed)."""
    return indexed_series_and_key(patches_dir, cache)[0]


def indexed_series_and_key(
    patches_dir: Path, cache: CacheFolder, known: tuple[str, bool] | None = None
) -> tuple[list[Patch], str | None]:
    """:func:`read_indexed_series`, and the index key when the series is indexed under it (what
    is derived from the series alone may be cached under that key: :mod:`.activation_memo`).
    ``known``: the folder's :func:`series_key`, if the caller has it."""
    if not cache.usable:
        return read_series(patches_dir, lazy=True), None
    found_key = known or folder_key(patches_dir)
    if found_key is None:
        return read_series(patches_dir, lazy=True), None  # says what is wrong with the folder
    key, storable = found_key
    found = SERIES_INDEX.load(cache, key)
    if found is not None:
        patches = _from_index(patches_dir, found[0])
        if patches is not None:
            return patches, key
    patches = read_series(patches_dir, lazy=True)
    # The key sees the folder's own entries only: a series that lists files elsewhere is not indexed.
    inside = all(v.path.parent == patches_dir for p in patches for v in p.variants)
    if storable and inside and folder_key(patches_dir) == (key, True):  # nothing changed while read
        SERIES_INDEX.store(cache, key, _to_index(patches))
        return patches, key
    return patches, None


def _to_index(patches: list[Patch]) -> dict[str, bytes]:
    """The series, in order: each patch's rows (one per patch file, and one more for a file that
    could not be parsed), marshalled on their own, so that a process makes only the patches it uses."""
    import marshal

    index: dict[str, bytes] = {}
    for patch in patches:
        rows: list[tuple[Any, ...]] = []
        for v in patch.variants:
            fields = {k: v.fields[k] for k in INDEXED_FIELDS if k in v.fields}
            rows.append((v.name, v.subject, fields, v.paths, bytes.fromhex(v.digest)))
        if patch.error is not None:
            rows.append((patch.error,))
        index[patch.id] = marshal.dumps(tuple(rows))
    return index


def _is_index(value: Any) -> bool:
    return type(value) is dict


# Bump when what the index holds, or how a patch file is parsed, changes shape.
SERIES_INDEX = Record("series index", 6, _is_index)


def _from_index(patches_dir: Path, index: dict[Any, Any]) -> list[Patch] | None:
    """The patches the index describes, or None if it is not exactly what :func:`_to_index` makes."""
    patches = []
    for pid, rows in index.items():
        patch = _patch_from_index(patches_dir, pid, rows)
        if patch is None:
            return None
        patches.append(patch)
    return patches or None


def _patch_from_index(patches_dir: Path, pid: Any, blob: Any) -> Patch | None:
    """The patch ``pid`` as its index rows ``blob`` describe it, or None if they are not exactly
    what :func:`_to_index` makes."""
    import marshal

    if type(pid) is not str or not pid or type(blob) is not bytes:
        return None
    try:
        rows = marshal.loads(blob)
    except (EOFError, ValueError, TypeError):
        return None
    if type(rows) is not tuple or not rows:
        return None
    patch = Patch(pid)
    for row in rows:
        if type(row) is not tuple:
            return None
        if len(row) == 1 and type(row[0]) is str and row is rows[-1]:  # its file could not be parsed
            patch.error = row[0]
            continue
        if len(row) != 5:
            return None
        name, subject, fields, paths, digest = row
        # C-speed checks: join raises TypeError for anything but strings.
        try:
            "".join(fields.values()) + "".join(paths)
        except (TypeError, AttributeError):
            return None
        if not (
            type(name) is str
            and name
            and "/" not in name
            and name not in (".", "..")
            and type(subject) is str
            and type(fields) is dict
            and fields.keys() <= _INDEXED
            and fields.get("Overlay-Id") == pid
            and type(paths) is tuple
            and paths
            and all(map(str.startswith, paths, repeat("torch/")))
            and type(digest) is bytes
            and len(digest) == 32
        ):
            return None
        patch.variants.append(PatchFile.indexed(patches_dir, name, subject, fields, paths, digest.hex()))
    return patch


class IndexedPatches:
    """The patches of an indexed series, each made from the index when first asked for.

    A process that recalls its activation (:mod:`.activation_memo`) needs a patch's variants only
    when a component of it is decided, or for ``status``: the others are never made. An index
    gone or not believed since is read from the files instead (``read_series``); a patch no longer
    in them fails.
    """

    def __init__(self, patches_dir: Path, cache: CacheFolder, key: str, ids: list[str]) -> None:
        self._dir = patches_dir
        self._cache = cache
        self._key = key
        self._ids = ids  # the series' ids as the caller knows them (the activation memo)
        self._rows: dict[Any, Any] | None = None
        self._read: dict[str, Patch] | None = None  # read from the files

    def _index(self) -> dict[Any, Any]:
        """The index's rows, loaded when a patch is first made: an index that does not list the
        caller's ids, in order, is not believed (every patch is read from the files)."""
        if self._rows is None:
            found = SERIES_INDEX.load(self._cache, self._key)
            rows = found[0] if found is not None else {}
            self._rows = rows if list(rows) == self._ids else {}
        return self._rows

    def get(self, pid: str) -> Patch:
        """The patch ``pid`` of the series."""
        patch = _patch_from_index(self._dir, pid, self._index().get(pid))
        if patch is not None:
            return patch
        if self._read is None:
            self._read = self._from_files()
        patch = self._read.get(pid)
        if patch is None:
            why = f"no longer in {self._dir / 'series'} as this process read it; a new process reads it again"
            patch = Patch(pid, error=why)
        return patch

    def _from_files(self) -> dict[str, Patch]:
        """The series read from its files, if they are still those of the index key (else none:
        a patch decided now must be the one activation was recalled for); indexed again, so that
        the next process does not read every file too."""
        try:
            if series_key(self._dir)[0] != self._key:
                return {}
            patches = read_series(self._dir, lazy=True)
            key, storable = series_key(self._dir)
            if key != self._key:
                return {}
        except (SeriesError, OSError, ValueError):  # it runs inside an import: never raise there
            return {}
        inside = all(v.path.parent == self._dir for p in patches for v in p.variants)
        if storable and inside and [p.id for p in patches] == self._ids:
            SERIES_INDEX.store(self._cache, self._key, _to_index(patches))
        return {p.id: p for p in patches}
