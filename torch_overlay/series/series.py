"""Read ``patches/series`` into patches grouped by Overlay-Id (a patch and its variants)."""

from __future__ import annotations

from pathlib import Path

from .patchfile import PatchFile, PatchParseError, parse_patch
from .._state import Target
from .versions import version_in

__all__ = ["Patch", "SeriesError", "read_series"]


class SeriesError(Exception):
    """The series cannot be read: no such folder, no ``series`` file in it, one that cannot be read
    (permissions, not UTF-8), or an empty one."""


class Patch:
    """One fix: its id and the variants (diffs) that may carry it."""

    __slots__ = ("id", "variants", "error")  # a plain class: `import torch_overlay` makes no dataclass

    def __init__(self, id: str, variants: list[PatchFile] | None = None, error: str | None = None) -> None:
        self.id = id
        self.variants: list[PatchFile] = [] if variants is None else variants
        self.error = error  # set when the patch file could not be parsed

    def __repr__(self) -> str:
        return f"Patch({self.id!r}, {self.variants!r}, error={self.error!r})"

    @property
    def main(self) -> PatchFile | None:
        return self.variants[0] if self.variants else None

    @property
    def targets(self) -> list[Target]:
        """Every file any variant touches, in first-seen order."""
        seen: dict[str, None] = {}
        for variant in self.variants:
            for path in variant.paths:
                seen.setdefault(path, None)
        return [Target.from_path(p) for p in seen]

    def ordered_variants(self, torch_version: str) -> list[PatchFile]:
        """Variants written for ``torch_version`` first, then general ones, then the rest."""
        if len(self.variants) == 1:  # most patches: nothing to order
            return list(self.variants)

        def rank(variant: PatchFile) -> int:
            spec = variant.field("Torch-Versions")
            if not spec:
                return 1
            return 0 if version_in(torch_version, spec) else 2

        return sorted(self.variants, key=rank)


def _id_from_filename(name: str) -> str:
    stem = name[: -len(".patch")] if name.endswith(".patch") else name
    stem = stem.split("@", 1)[0]
    head, _, rest = stem.partition("-")
    return rest if head.isdigit() and rest else stem


def read_series(patches_dir: Path, *, lazy: bool = False) -> list[Patch]:
    """Parse the series; a malformed entry becomes a Patch with ``error`` set, others still load.

    With ``lazy`` (the runtime overlay), each diff's hunks are parsed when first used.

    Raise :class:`SeriesError` when there is no series to read: a patch set that silently loads
    nothing would look like a torch that needs no fix.
    """
    series = patches_dir / "series"
    try:  # read at `import torch_overlay`: a warning, never a crash
        if not patches_dir.is_dir():
            raise SeriesError(f"the patch folder {patches_dir} does not exist or is not a folder")
        if not series.is_file():
            raise SeriesError(f"{series} does not exist")
        text = series.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # no permission, not UTF-8
        raise SeriesError(f"{series} cannot be read ({exc})") from exc
    patches: dict[str, Patch] = {}
    mains: dict[str, str] = {}  # id -> the file that is not a variant (no `@<minor>` in its name)
    for lineno, raw in enumerate(text.splitlines(), 1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = patches_dir / name
        try:
            if not path.is_file():
                raise PatchParseError(series, lineno, f"{name} is listed but does not exist")
            parsed = parse_patch(path, lazy=lazy)
        except (OSError, UnicodeDecodeError) as exc:
            pid = _id_from_filename(name)
            patches.setdefault(pid, Patch(pid)).error = str(PatchParseError(path, 1, f"cannot be read ({exc})"))
            continue
        except PatchParseError as exc:
            pid = _id_from_filename(name)
            patches.setdefault(pid, Patch(pid)).error = str(exc)
            continue
        patch = patches.setdefault(parsed.id, Patch(parsed.id))
        patch.variants.append(parsed)
        if "@" not in path.name and mains.setdefault(parsed.id, name) != name:
            # Two fixes under one id: applying either would hide the other behind its status line.
            patch.error = (
                f"{mains[parsed.id]} and {name} both say Overlay-Id: {parsed.id} (one id is one fix; a "
                f"variant of it is named NNNN-{parsed.id}@<torch minor>.patch): neither is applied"
            )
    if not patches:
        raise SeriesError(f"{series} lists no patches")
    return list(patches.values())
