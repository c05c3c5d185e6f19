"""Confinement of the paths the verbs write: inside the checkout or the output folder, or refused."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from . import BuildError

__all__ = ["confined"]


def confined(root: Path, relative: str, what: str) -> Path:
    """``root / relative``, refused unless it stays inside ``root`` with symlinks resolved.

    ``relative`` comes from a patch, a wheel or the series (a diff path, ``Upstream-Test``, a
    version): an absolute path, a ``..`` component or a symlinked folder leading out of ``root``
    would make a verb write where the user never asked.
    """
    parts = PurePosixPath(relative)
    if not relative or parts.is_absolute() or ".." in parts.parts:
        raise BuildError(f"{what} {relative!r} is not a relative path inside {root}; refused, nothing was changed")
    target = root / parts
    real_root = root.resolve()
    if not target.resolve().is_relative_to(real_root):
        raise BuildError(
            f"{what} {relative!r} leads outside {root} through a symlink ({target.resolve()}); "
            "refused, nothing was changed"
        )
    return target
