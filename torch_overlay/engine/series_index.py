"""The series as activation needs it, kept in the code cache like ``__pycache__`` keeps bytecode.

``import torch_overlay`` needs, of each patch file, its id, subject, the fields that say whether it
applies to the installed torch (``INDEXED_FIELDS``; the others are read from the file when used), the files its diff
changes and a digest of its text (a decision and the compile caches' salt are keyed on it).
Reading and parsing every patch file for that cost more than anything else the overlay adds to
``import torch``, and grew with the series. The index holds exactly that, as plain tuples, dicts and strings in a code cache
entry (written atomically, in a private folder, checked before use: :mod:`.codecache`), under a key
made of what ``stat`` says of each entry of the series folder (name, size, mtime, inode, ctime):
a patch edited, added, removed or renamed changes the key, and the series is read again. Nothing in
it is executed, and an entry that is not exactly the expected shape is ignored and rebuilt.

A patch's text is read only when it is needed (:class:`~..series.patchfile.PatchFile`): its hunks,
when a component is decided; its description and ``Error:`` lines for ``status`` or a hint.
"""

from __future__ import annotations

import os
import time
from itertools import repeat
from pathlib import Path
from typing import Any, TYPE_CHECKING

from .._version import __version__
from ..series.patchfile import INDEXED_FIELDS, KNOWN_FIELDS, MULTI_FIELDS, PatchFile
from ..series.series import Patch, read_series

if TYPE_CHECKING:
    from .codecache import CodeCache

__all__ = ["indexed_series_and_key", "read_indexed_series", "series_key"]

# Bump when what the index holds, or how a patch file is parsed, changes shape.
KIND = "series index 4"
# A file written this recently may be rewritten within the clock's resolution without its
# signature changing (git's "racily clean" index entries): such a series is read, not indexed.
RACY_NS = 2_000_000_000

_INDEXED = frozenset(INDEXED_FIELDS)


def series_key(patches_dir: Path) -> tuple[str, bool]:
    """The index key of the series folder, from ``stat`` alone, and whether it may be stored now
    (no entry was changed within the last ``RACY_NS``). Raises ``OSError`` for no such folder."""
    import hashlib
    import marshal

    now = time.time_ns()
    with os.scandir(patches_dir) as entries:
        # Tuples of ints, digested at C speed: formatting them costs more per file than the stat.
        listing = [
            (e.name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns) for e in entries for st in (e.stat(),)
        ]
    listing.sort()
    # A write sets the mtime to the clock's now, so the mtimes alone say whether it is racy.
    racy = any(abs(now - row[2]) < RACY_NS for row in listing)
    digest = hashlib.sha256(marshal.dumps(listing)).hexdigest()
    parts = [KIND, __version__, ",".join(KNOWN_FIELDS + MULTI_FIELDS), os.path.abspath(patches_dir), digest]
    return "\0".join(parts), not racy


def read_indexed_series(patches_dir: Path, cache: CodeCache) -> list[Patch]:
    """The series of ``patches_dir`` as :func:`~..series.series.read_series` (``lazy``) gives it:
    from the index when it matches the folder, else read from the files (and indexed)."""
    return indexed_series_and_key(patches_dir, cache)[0]


def indexed_series_and_key(patches_dir: Path, cache: CodeCache) -> tuple[list[Patch], str | None]:
    """:func:`read_indexed_series`, and the index key when the series is indexed under it (what
    is derived from the series alone may be cached under that key: :mod:`.activation_memo`)."""
    if not cache.usable:
        return read_series(patches_dir, lazy=True), None
    try:
        key, storable = series_key(patches_dir)
    except OSError:
        return read_series(patches_dir, lazy=True), None  # says what is wrong with the folder
    found = cache.load(key, _is_index)
    if found is not None:
        patches = _from_index(patches_dir, found[0])
        if patches is not None:
            return patches, key
    patches = read_series(patches_dir, lazy=True)
    # The key sees the folder's own entries only: a series that lists files elsewhere is not indexed.
    inside = all(v.path.parent == patches_dir for p in patches for v in p.variants)
    if storable and inside and series_key(patches_dir) == (key, True):  # nothing changed while read
        cache.store(key, _to_index(patches))
        return patches, key
    return patches, None


def _to_index(patches: list[Patch]) -> tuple[str, list[tuple[Any, ...]]]:
    """The series, in order: one row per patch file (or per file that could not be parsed)."""
    rows: list[tuple[Any, ...]] = []
    for patch in patches:
        for v in patch.variants:
            fields = {k: v.fields[k] for k in INDEXED_FIELDS if k in v.fields}
            rows.append((v.name, v.subject, fields, v.paths, bytes.fromhex(v.digest)))
        if patch.error is not None:
            rows.append((patch.id, patch.error))
    return KIND, rows


def _is_index(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and value[0] == KIND and isinstance(value[1], list)


def _from_index(patches_dir: Path, index: tuple[str, list[Any]]) -> list[Patch] | None:
    """The patches the index describes, or None if it is not exactly what :func:`_to_index` makes."""
    patches: dict[str, Patch] = {}
    for row in index[1]:
        if type(row) is not tuple:
            return None
        if len(row) == 2 and type(row[0]) is str and type(row[1]) is str:  # a file that could not be parsed
            patches.setdefault(row[0], Patch(row[0])).error = row[1]
            continue
        if len(row) != 5:
            return None
        name, subject, fields, paths, digest = row
        # C-speed checks (they run for every patch file at every import): join raises TypeError
        # for anything but strings.
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
            and "Overlay-Id" in fields
            and type(paths) is tuple
            and paths
            and all(map(str.startswith, paths, repeat("torch/")))
            and type(digest) is bytes
            and len(digest) == 32
        ):
            return None
        variant = PatchFile.indexed(patches_dir, name, subject, fields, paths, digest.hex())
        patch = patches.get(variant.id)
        if patch is None:
            patch = patches[variant.id] = Patch(variant.id)
        patch.variants.append(variant)
    return list(patches.values()) if patches else None
