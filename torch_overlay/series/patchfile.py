"""Parse one ``git format-patch`` file: mail header, DEP-3 fields, description and hunks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .._state import Target

__all__ = ["FileDiff", "Hunk", "PatchFile", "PatchParseError", "parse_patch"]

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
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
            self.parsed = _parse_diff(self.path, self.text.splitlines(), self.diff_start)
        return self.parsed

    @property
    def id(self) -> str:
        return self.fields["Overlay-Id"]

    @property
    def title(self) -> str:
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", self.subject)


def _strip_prefix(path: str, lineno: int, source: Path) -> str:
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
        lineno = text.count("\n", 0, m.start()) + 1
        _strip_prefix(m.group(1), lineno, path)
        found.setdefault(_strip_prefix(m.group(2), lineno + 1, path), None)
    return tuple(found)


def _parse_diff(path: Path, lines: list[str], i: int) -> tuple[FileDiff, ...]:
    """The file diffs and hunks from line index ``i`` on."""
    files: list[FileDiff] = []
    cur_path: str | None = None
    cur_hunks: list[Hunk] = []

    def flush() -> None:
        if cur_path is not None:
            if not cur_hunks:
                raise PatchParseError(path, i + 1, f"no hunks for {cur_path}")
            files.append(FileDiff(cur_path, tuple(cur_hunks)))

    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchParseError(path, i + 2, "'---' line not followed by '+++'")
            flush()
            old = _strip_prefix(line[4:], i + 1, path)
            new = _strip_prefix(lines[i + 1][4:], i + 2, path)
            if old != new:
                raise PatchParseError(path, i + 1, f"renames are not supported ({old} -> {new})")
            cur_path, cur_hunks = new, []
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if cur_path is None:
                raise PatchParseError(path, i + 1, "hunk before any '---'/'+++' file header")
            old_start, new_start = int(m.group(1)), int(m.group(3))
            old_count = int(m.group(2)) if m.group(2) is not None else 1
            new_count = int(m.group(4)) if m.group(4) is not None else 1
            header_line = i + 1
            body: list[tuple[str, str]] = []
            seen_old = seen_new = 0
            i += 1
            while seen_old < old_count or seen_new < new_count:
                if i >= len(lines):
                    raise PatchParseError(path, header_line, "hunk ends before its line counts are met")
                raw = lines[i]
                tag, content = (raw[:1] or " "), raw[1:]
                if raw.startswith("\\"):
                    i += 1
                    continue
                if tag not in (" ", "-", "+"):
                    raise PatchParseError(
                        path, i + 1, f"unexpected line in hunk (counts say {old_count}/{new_count}): {raw!r}"
                    )
                seen_old += tag in (" ", "-")
                seen_new += tag in (" ", "+")
                if seen_old > old_count or seen_new > new_count:
                    raise PatchParseError(path, header_line, "hunk has more lines than its header says")
                body.append((tag, content))
                i += 1
            cur_hunks.append(Hunk(old_start, old_count, new_start, new_count, tuple(body), header_line))
            continue
        i += 1
    flush()
    if not files:
        raise PatchParseError(path, len(lines), "no diff in patch")
    return tuple(files)
