"""Parse one ``git format-patch`` file: mail header, DEP-3 fields, description and hunks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hunks import FileDiff


__all__ = ["diff_path", "PatchFile", "PatchParseError", "parse_patch"]

_FILE_HEADER_RE = re.compile(r"^--- (.*)\n\+\+\+ (.*)$", re.M)
_FIELD_RE = re.compile(r"^([A-Z][A-Za-z0-9-]*): ?(.*)$")
# Fields the overlay understands inside the commit message (DEP-3 style).
KNOWN_FIELDS = (
    "Overlay-Id",
    "Bug",
    "Origin",
    "Forwarded",
    "Applied-Upstream",
    "Introduced",
    "Affects",
    "Torch-Versions",
    "Test",
    "Test-Select",
    "Quick-Test",
    "Symptom",
    "Upstream-Test",
    "Guard-Test",
    "Upstream-Guard-Test",
    "Last-Update",
)


NOTES_MARK = "Overlay-Notes:"


class PatchParseError(ValueError):
    """A patch file is malformed; names the file and line."""

    def __init__(self, path: Path | str, lineno: int, message: str) -> None:
        super().__init__(f"{path}:{lineno}: {message}")
        self.path = str(path)
        self.lineno = lineno


@dataclass
class PatchFile:
    path: Path
    subject: str
    fields: dict[str, str]
    description: str  # the upstream summary
    parsed: tuple[FileDiff, ...] | None  # the diff; None until ``files`` is first read
    text: str = field(repr=False, default="")
    overlay_notes: str = ""  # after `Overlay-Notes:`: for this project only, never staged
    paths: tuple[str, ...] = ()  # the files the diff changes, read from its headers alone
    diff_start: int = 0  # index of the diff's first line in ``text.splitlines()``

    @property
    def files(self) -> tuple[FileDiff, ...]:
        """The diff, parsed on first use; raises :class:`PatchParseError` if it is malformed."""
        if self.parsed is None:
            from .hunks import parse_diff  # here: `import torch_overlay` reads no hunk

            self.parsed = parse_diff(self.path, self.text.splitlines(), self.diff_start)
        return self.parsed

    @property
    def id(self) -> str:
        return self.fields["Overlay-Id"]

    @property
    def title(self) -> str:
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", self.subject)


def diff_path(path: str, lineno: int, source: Path) -> str:
    path = path.split("\t")[0].strip()
    if path == "/dev/null":
        raise PatchParseError(source, lineno, "creating or deleting files is not supported")
    if path[:2] in ("a/", "b/"):
        path = path[2:]
    if not path.startswith("torch/"):
        raise PatchParseError(source, lineno, f"path {path!r} is outside the torch/ tree")
    return path


def parse_patch(path: Path | str, text: str | None = None, *, lazy: bool = False) -> PatchFile:
    """Parse ``path``; raise :class:`PatchParseError` on anything malformed.

    With ``lazy``, only the message and the diff's file headers are read now (what ``import
    torch_overlay`` needs); the hunks are parsed, and checked, when ``files`` is first read.
    """
    path = Path(path)
    if text is None:
        text = path.read_text(encoding="utf-8")
    lines = text.splitlines()

    # Mail header: up to the first blank line.
    subject = ""
    i = 0
    while i < len(lines) and lines[i].strip():
        if lines[i].startswith("Subject:"):
            subject = lines[i][len("Subject:") :].strip()
            # RFC 822 continuation lines
            while i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t") and lines[i + 1].strip():
                i += 1
                subject += " " + lines[i].strip()
        i += 1
    if not subject:
        raise PatchParseError(path, 1, "no 'Subject:' line in the mail header")

    # Message body: DEP-3 fields and free text, up to the diffstat separator or first diff.
    # From an `Overlay-Notes:` line on, the text is about this project (variants, tests, the
    # runtime overlay) and stays out of the upstream PR.
    fields: dict[str, str] = {}
    description: list[str] = []
    notes: list[str] | None = None
    while i < len(lines) and lines[i] != "---" and not lines[i].startswith("diff --git "):
        m = _FIELD_RE.match(lines[i])
        if notes is not None:
            notes.append(lines[i])
        elif lines[i].startswith(NOTES_MARK):
            notes = [lines[i][len(NOTES_MARK) :].strip()]
        elif m and m.group(1) in KNOWN_FIELDS:
            fields[m.group(1)] = m.group(2).strip()
        else:
            description.append(lines[i])
        i += 1
    if "Overlay-Id" not in fields:
        raise PatchParseError(path, i + 1, "no 'Overlay-Id:' field in the message")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", fields["Overlay-Id"]):
        raise PatchParseError(path, i + 1, f"bad Overlay-Id {fields['Overlay-Id']!r}")

    overlay_notes = "\n".join(notes).strip() if notes else ""
    description_text = "\n".join(description).strip()
    paths = _diff_paths(path, text)
    if not paths:
        raise PatchParseError(path, len(lines), "no diff in patch")
    patch = PatchFile(path, subject, fields, description_text, None, text, overlay_notes, paths, i)
    if not lazy:
        patch.files  # noqa: B018 - parse and check the hunks now
    return patch


def _diff_paths(path: Path, text: str) -> tuple[str, ...]:
    """The files a diff changes, from its ``---``/``+++`` header pairs (a file once, in order)."""
    found: dict[str, None] = {}
    for m in _FILE_HEADER_RE.finditer(text):
        try:
            diff_path(m.group(1), 0, path)
            found.setdefault(diff_path(m.group(2), 0, path), None)
        except PatchParseError:  # say where: count the lines only now
            lineno = text.count("\n", 0, m.start()) + 1
            diff_path(m.group(1), lineno, path)
            diff_path(m.group(2), lineno + 1, path)
    return tuple(found)
