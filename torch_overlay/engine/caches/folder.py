"""The cache folder: values kept on disk for the next process, like ``__pycache__`` keeps bytecode.

Loading an entry executes it inside torch, so an entry is read only from a folder that this user
owns and nobody else can write to, and only if it verifies: each file carries a digest of the key
it was written for and a checksum of its payload (a CRC, not a digest: nobody else can write in the
folder, and hashing a module's code and text with sha256 cost more than the rest of a recalled
decision during ``import torch``). Anything else is ignored (a folder) or deleted and rebuilt
(an entry); a cache that cannot be used only costs compile time.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ..once_per_job import warn

if TYPE_CHECKING:
    from ..._config import Config

__all__ = ["CacheFolder"]

# Part of every key's digest and of the file header: bump it when the file layout changes (what
# each kind of entry holds is versioned by its record, engine/caches/record.py).
FORMAT = b"torch_overlay code cache 8\n"
_DIGEST = 32  # sha256 of the key
_CHECKSUM = 4  # crc32 of the payload


def checksum(payload: bytes | memoryview) -> bytes:
    """What an entry stores to verify its payload."""
    import zlib

    return zlib.crc32(payload).to_bytes(_CHECKSUM, "big")


def _safe_stat(st: os.stat_result) -> bool:
    """Owned by this user and not writable by group or others."""
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class CacheFolder:
    """``load(key, check)`` and ``store(key, value)``: marshal-able values kept under ``folder``
    (callers go through a :class:`~.record.Record`, which keys and checks each kind)."""

    @classmethod
    def of(cls, config: Config) -> CacheFolder:
        """The folder the switches name: ``code`` in ``TORCH_OVERLAY_CACHE_DIR`` (none when
        ``TORCH_OVERLAY_CODE_CACHE=0``). ``TORCH_OVERLAY_REACH=1`` on Python 3.11 compiles a counter
        into each changed function, kept apart (3.12+ watches their code with sys.monitoring):
        engine/reach.py."""
        folder = config.cache_dir / "code" if config.code_cache and config.cache_dir else None
        return cls(folder, counting=config.reach and sys.version_info < (3, 12))

    def __init__(self, folder: Path | None, counting: bool = False) -> None:
        self.folder = folder  # None: no disk cache
        # Reach on Python 3.11: the code compiled through this cache counts the runs of each function a
        # patch changed (engine/reach_counter.py); modcode and codeswap key such code apart.
        self.counting = counting
        self._usable: bool | None = None

    def _ready(self) -> bool:
        """Create the folder (0700) or accept an existing one that only this user can write."""
        if self._usable is None:
            self._usable = self.folder is not None and self._prepare(self.folder)
        return self._usable

    def _prepare(self, folder: Path) -> bool:
        """The top folder (``TORCH_OVERLAY_CACHE_DIR``) is made 0700 if new and must be safe before
        anything is created inside it; then ``folder`` itself, 0700."""
        for path in (folder.parent, folder):
            try:
                path.mkdir(mode=0o700, parents=True)
            except FileExistsError:
                pass
            except OSError as exc:
                return self._refuse(path, f"cannot be created ({exc.strerror or exc})")
            try:
                st = os.lstat(path)
            except OSError as exc:
                return self._refuse(path, f"cannot be read ({exc.strerror or exc})")
            if stat.S_ISLNK(st.st_mode):
                return self._refuse(path, "is a symbolic link")
            if not stat.S_ISDIR(st.st_mode):
                return self._refuse(path, "is not a folder")
            if not _safe_stat(st):
                return self._refuse(path, "is not owned by this user or is writable by others")
        return True

    @staticmethod
    def _refuse(path: Path, why: str) -> bool:
        warn(
            f"torch_overlay: the code cache folder {path} {why}; it is not used (patched code is "
            "compiled in memory). Set TORCH_OVERLAY_CACHE_DIR to a private folder."
        )
        return False

    @property
    def usable(self) -> bool:
        """Whether entries can be read and written (the folder is ready and private)."""
        return self._ready()

    def load(self, key: str, check: Callable[[Any], bool]) -> tuple[Any] | None:
        """``(value,)`` stored for ``key`` if it verifies and passes ``check``; None otherwise."""
        if not self._ready():
            return None
        path, key_digest = self._entry(key)
        return self._read(path, key_digest, check)

    def has(self, key: str) -> bool:
        """Whether a file is stored for ``key`` (unread, so not yet verified)."""
        return self._ready() and os.path.isfile(self._entry(key)[0])

    def store(self, key: str, value: object) -> None:
        """Keep ``value`` (marshal-able) for ``key``; a cache that cannot be written is skipped."""
        if self._ready():
            self._write(*self._entry(key), value)

    def _entry(self, key: str) -> tuple[Path, bytes]:
        import hashlib  # here, not at import: `import torch_overlay` stays light

        assert self.folder is not None
        key_digest = hashlib.sha256(FORMAT + key.encode()).digest()
        return self.folder / f"{key_digest.hex()[:40]}.marshal", key_digest

    def _read(self, path: Path, key_digest: bytes, check: Callable[[Any], bool]) -> tuple[Any] | None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None  # absent (or a symlink someone planted)
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or not _safe_stat(st):
                    return None
                data = f.read()
        except OSError:
            return None
        head = len(FORMAT)
        payload = memoryview(data)[head + _DIGEST + _CHECKSUM :]
        try:
            if (
                data[:head] != FORMAT
                or data[head : head + _DIGEST] != key_digest
                or data[head + _DIGEST : head + _DIGEST + _CHECKSUM] != checksum(payload)
            ):
                raise ValueError("digest mismatch")
            value = marshal.loads(payload)
            if not check(value):
                raise ValueError("unexpected shape")
        except (ValueError, EOFError, TypeError):
            self._discard(path)
            return None
        return (value,)

    def _write(self, path: Path, key_digest: bytes, value: object) -> None:
        try:
            payload = marshal.dumps(value)  # type: ignore[arg-type]  # any value: ValueError if not marshal-able
        except ValueError:
            return
        import tempfile

        tmp = None
        try:
            # mkstemp: O_EXCL in our own folder, so a planted name is never followed or overwritten.
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=path.stem, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(FORMAT + key_digest + checksum(payload) + payload)
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass  # a full or read-only disk only costs compile time
        finally:
            if tmp is not None:
                self._discard(Path(tmp))

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass
