"""The known bugs: the series' fixes (their ``Error:`` lines) and the reports looked at and not
taken (``patches/looked-at.toml``), read without importing torch."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..series.series import Patch, read_series
from .signatures import parse_signatures, Signature, SignatureError
from .subsystems import pointed_at

__all__ = ["Catalogue", "CatalogueError", "KnownBug", "LOOKED_AT", "load_catalogue"]

LOOKED_AT = "looked-at.toml"
_LOOKED_AT_KEYS = {
    "id": str,
    "report": list,
    "title": str,
    "errors": list,
    "examples": list,
    "seen": str,
    "measured": str,
    "verdict": str,
    "workaround": str,
    "fixed_upstream": str,
    "versions": dict,
}
_REQUIRED = ("id", "report", "title", "seen", "measured", "verdict")


class CatalogueError(ValueError):
    """A signature or a looked-at entry that cannot be read."""


def link_name(url: str) -> str:
    """``https://github.com/pytorch/pytorch/issues/1`` -> ``pytorch#1`` (other links as they are)."""
    m = re.match(r"https://github\.com/pytorch/(\w+)/(?:issues|pull)/(\d+)", url.strip())
    return f"{m.group(1)}#{m.group(2)}" if m else url.strip()


@dataclass(frozen=True)
class KnownBug:
    id: str
    kind: str  # "fix" (a patch of the series) or "looked-at"
    title: str
    links: tuple[str, ...]
    signatures: tuple[Signature, ...]
    patch: Patch | None = None  # kind "fix"
    entry: dict = field(default_factory=dict, hash=False, compare=False)  # kind "looked-at"

    @property
    def parts(self) -> frozenset[str]:
        """The parts of torch the bug is in (DTensor, FSDP, compile, ...), as its title names them.

        Only where the title names none, its description does (the symptom, or what a looked-at
        report saw). The description and the tests also name the circumstances the bug was met in
        (FSDP2 as one way to have DTensor gradients, a test file under fsdp/), and a guess held back
        until the paste names those held back the pastes that name only where the bug is."""
        named = pointed_at(self.title)
        if named:
            return named
        if self.kind == "fix":
            assert self.patch is not None and self.patch.main is not None, self.id  # a fix has its file
            return pointed_at(self.patch.main.fields.get("Symptom", ""))
        return pointed_at(self.entry.get("seen", ""))

    @property
    def link_names(self) -> str:
        return ", ".join(link_name(u) for u in self.links) or "found here"


@dataclass
class Catalogue:
    bugs: list[KnownBug]
    problems: list[str]  # entries whose signatures could not be read (they match nothing)

    def fixes(self) -> list[KnownBug]:
        return [b for b in self.bugs if b.kind == "fix"]

    def looked_at(self) -> list[KnownBug]:
        return [b for b in self.bugs if b.kind == "looked-at"]


def _fix(patch: Patch, problems: list[str]) -> KnownBug | None:
    main = patch.main
    if main is None:
        return None
    try:
        signatures = parse_signatures(main.errors)
    except SignatureError as exc:
        problems.append(f"{main.path.name}: {exc}")
        signatures = ()
    links = tuple(u.strip() for u in main.fields.get("Bug", "").split(",") if u.strip())
    return KnownBug(patch.id, "fix", main.title, links, signatures, patch=patch)


def read_looked_at(path: Path) -> list[dict]:
    """The ``[[report]]`` entries of ``path``; raise :class:`CatalogueError` on a malformed one."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    entries = data.get("report", [])
    for n, entry in enumerate(entries, 1):
        where = f"{path.name}, report {n} ({entry.get('id', 'no id')})"
        missing = [k for k in _REQUIRED if k not in entry]
        if missing:
            raise CatalogueError(f"{where}: missing {', '.join(missing)}")
        for key, value in entry.items():
            if key not in _LOOKED_AT_KEYS:
                raise CatalogueError(f"{where}: unknown key {key!r}")
            if not isinstance(value, _LOOKED_AT_KEYS[key]):
                raise CatalogueError(f"{where}: {key} must be a {_LOOKED_AT_KEYS[key].__name__}")
    return entries


def load_catalogue(patches_dir: Path) -> Catalogue:
    """Every known bug of the series in ``patches_dir`` and of its ``looked-at.toml``."""
    problems: list[str] = []
    bugs = [b for p in read_series(patches_dir, lazy=True) if (b := _fix(p, problems)) is not None]
    looked_at = patches_dir / LOOKED_AT
    if looked_at.is_file():
        for entry in read_looked_at(looked_at):
            try:
                signatures = parse_signatures(entry.get("errors", []))
            except SignatureError as exc:
                problems.append(f"{LOOKED_AT} {entry['id']}: {exc}")
                signatures = ()
            bugs.append(
                KnownBug(entry["id"], "looked-at", entry["title"], tuple(entry["report"]), signatures, entry=entry)
            )
    return Catalogue(bugs, problems)
