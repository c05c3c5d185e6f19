"""Parse one ``git format-patch`` file: mail header, DEP-3 fields, description and hunks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .diff_types import diff_path, PatchParseError

if TYPE_CHECKING:
    from .hunks import FileDiff

__all__ = ["PatchFile", "PatchParseError", "parse_patch"]

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
    "Error-Test",
    "Last-Update",
)
# Fields that may appear more than once; each occurrence is kept, in order (``PatchFile.errors``).
MULTI_FIELDS = ("Error",)


NOTES_MARK = "Overlay-Notes:"

_SUBJECT_RE = re.compile(r"^Subject:(.*(?:\n[ \t].*\S.*)*)", re.M)
_KNOWN = frozenset(KNOWN_FIELDS)
_MULTI = frozenset(MULTI_FIELDS)


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
    errors: tuple[str, ...] = ()  # the `Error:` lines: what the bug raises (torch_overlay.known)

    @property
    def files(self) -> tuple[FileDiff, ...]:
        """The diff, parsed on first use; raises :class:`PatchParseError` if it is malformed."""
        if self.parsed is None:
            from .hunks import parse_diff  # here: `import torch_overlay` reads no hunk

            self.parsed = parse_diff(self.path, self.text.splitlines(), self.diff_start)
        return self.parsed

    @property
    def python_paths(self) -> tuple[str, ...]:
        """The Python files among ``paths``: what the runtime overlay and a rebuilt wheel can change
        (the others, C++ sources, only a source build carries)."""
        return tuple(p for p in self.paths if p.endswith(".py"))

    @property
    def id(self) -> str:
        return self.fields["Overlay-Id"]

    @property
    def title(self) -> str:
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", self.subject)


def parse_patch(path: Path | str, text: str | None = None, *, lazy: bool = False) -> PatchFile:
    """Parse ``path``; raise :class:`PatchParseError` on anything malformed.

    With ``lazy``, only the message and the diff's file headers are read now (what ``import
    torch_overlay`` needs); the hunks are parsed, and checked, when ``files`` is first read.
    """
    path = Path(path)
    if text is None:
        text = path.read_text(encoding="utf-8")
    # Found with searches over the text, not a loop over its lines: `import torch_overlay` parses
    # every patch of the series (README, Benchmarks).

    # Mail header: up to the first blank line.
    blank = _find_line(text, "", 0)
    subject_match = _SUBJECT_RE.search(text, 0, blank)
    subject = " ".join(part.strip() for part in subject_match.group(1).split("\n")) if subject_match else ""
    if not subject:
        raise PatchParseError(path, 1, "no 'Subject:' line in the mail header")

    # Message body: DEP-3 fields and free text, up to the diffstat separator or first diff.
    # From an `Overlay-Notes:` line on, the text is about this project (variants, tests, the
    # runtime overlay) and stays out of the upstream PR.
    body_start = min(blank + 1, len(text))
    body_end = min(_find_line(text, "---", body_start), _find_line(text, "diff --git ", body_start, prefix=True))
    i = text.count("\n", 0, body_end)  # the line index where the body ends
    notes_at = _find_line(text, NOTES_MARK, body_start, body_end, prefix=True)
    message = text[body_start : min(notes_at, body_end)]
    fields: dict[str, str] = {}
    errors: list[str] = []
    description: list[str] = []
    for line in message.splitlines():
        name, colon, value = line.partition(":")
        if colon and name in _MULTI:
            errors.append(value.strip())
        elif colon and name in _KNOWN:
            fields[name] = value.removeprefix(" ").strip()  # the last one wins
        else:
            description.append(line)
    if "Overlay-Id" not in fields:
        raise PatchParseError(path, i + 1, "no 'Overlay-Id:' field in the message")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", fields["Overlay-Id"]):
        raise PatchParseError(path, i + 1, f"bad Overlay-Id {fields['Overlay-Id']!r}")

    notes: list[str] | None = None
    if notes_at < body_end:
        first, _, rest = text[notes_at + len(NOTES_MARK) : body_end].partition("\n")
        notes = [first.strip(), *rest.splitlines()]
    overlay_notes = "\n".join(notes).strip() if notes else ""
    description_text = "\n".join(description).strip()
    paths = _diff_paths(path, text)
    if not paths:
        raise PatchParseError(path, len(text.splitlines()), "no diff in patch")
    patch = PatchFile(path, subject, fields, description_text, None, text, overlay_notes, paths, i, tuple(errors))
    if not lazy:
        patch.files  # noqa: B018 - parse and check the hunks now
    return patch


def _find_line(text: str, line: str, start: int, end: int | None = None, *, prefix: bool = False) -> int:
    """Offset of the first line starting at or after ``start`` (a line start) and before ``end``
    that is ``line`` (with ``prefix``: that starts with it); ``end`` (default: the text's length)
    when there is none."""
    stop = len(text) if end is None else end
    head = line if prefix else f"{line}\n"
    candidates = []
    if text.startswith(head, start):
        candidates.append(start)
    found = text.find(f"\n{head}", start)
    if found >= 0:
        candidates.append(found + 1)
    if not prefix and text.endswith(f"\n{line}") and len(text) - len(line) >= start:
        candidates.append(len(text) - len(line))  # the last line, without a newline
    first = min(candidates, default=stop)
    return first if first < stop else stop


def _diff_paths(path: Path, text: str) -> tuple[str, ...]:
    """The files a diff changes, from its ``---``/``+++`` header pairs (a file once, in order)."""
    found: dict[str, None] = {}
    pos = text.find("\n--- ")
    while pos >= 0:
        start = pos + 1
        second = text.find("\n", start)
        if second >= 0 and text.startswith("+++ ", second + 1):
            third = text.find("\n", second + 1)
            old, new = text[start + 4 : second], text[second + 5 : third if third >= 0 else len(text)]
            try:
                diff_path(old, 0, path)
                found.setdefault(diff_path(new, 0, path), None)
            except PatchParseError:  # say where: count the lines only now
                lineno = text.count("\n", 0, start) + 1
                diff_path(old, lineno, path)
                diff_path(new, lineno + 1, path)
        pos = text.find("\n--- ", start)
    return tuple(found)
