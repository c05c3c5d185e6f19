"""Parse one ``git format-patch`` file: mail header, DEP-3 fields, description and hunks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .diff_header import diff_path, PatchParseError

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
    "Silent",
    "Last-Update",
)
# Fields that may appear more than once; each occurrence is kept, in order (``PatchFile.errors``).
MULTI_FIELDS = ("Error",)


NOTES_MARK = "Overlay-Notes:"
# The fields ``import torch_overlay`` reads (which patches apply to the installed torch, a status
# row's link): all that the series index keeps; :meth:`PatchFile.field` reads them without the file.
INDEXED_FIELDS = ("Overlay-Id", "Torch-Versions", "Introduced", "Applied-Upstream", "Bug")

# Compiled where a patch is parsed (re caches it), not at `import torch_overlay`: a warm import parses none.
_SUBJECT = r"^Subject:(.*(?:\n[ \t].*\S.*)*)"
_KNOWN = frozenset(KNOWN_FIELDS)
_MULTI = frozenset(MULTI_FIELDS)
_INDEXED = frozenset(INDEXED_FIELDS)


class PatchFile:
    """One patch file: from the file itself (:func:`parse_patch`), or from the series index
    (:meth:`indexed`, ``engine/series_index.py``), which knows only what ``import torch_overlay``
    needs. The rest (the text, the description, the notes, the ``Error:`` lines) is then read from
    the file when first used, and only if the file is still the one that was indexed."""

    # A plain class, not a dataclass: making a dataclass costs about 2 M instructions at import.
    __slots__ = (
        "_path",
        "_folder",
        "name",
        "subject",
        "_fields",
        "_all_fields",
        "_python_paths",
        "parsed",
        "paths",
        "_description",
        "_text",
        "_overlay_notes",
        "_diff_start",
        "_errors",
        "_digest",
    )

    def __init__(
        self,
        path: Path,
        subject: str,
        fields: dict[str, str],
        description: str,
        parsed: tuple[FileDiff, ...] | None,  # the diff; None until ``files`` is first read
        text: str = "",
        overlay_notes: str = "",  # after `Overlay-Notes:`: for this project only, never staged
        paths: tuple[str, ...] = (),  # the files the diff changes, read from its headers alone
        diff_start: int = 0,  # index of the diff's first line in ``text.splitlines()``
        errors: tuple[str, ...] = (),  # the `Error:` lines: what the bug raises (torch_overlay.known)
    ) -> None:
        self._path: Path | None = path
        self._folder: Path | None = None  # an indexed patch: its folder, ``path`` made when first used
        self.name = path.name  # the file name
        self.subject = subject
        self._fields = fields
        self._all_fields = True  # False: only INDEXED_FIELDS (an indexed patch, until its file is read)
        self._python_paths: tuple[str, ...] | None = None
        self.parsed = parsed
        self.paths = paths
        self._description = description  # the upstream summary
        self._text: str | None = text  # None: not read yet (an indexed patch)
        self._overlay_notes = overlay_notes
        self._diff_start = diff_start
        self._errors = errors
        self._digest: str | None = None

    @classmethod
    def indexed(
        cls, folder: Path, name: str, subject: str, fields: dict[str, str], paths: tuple[str, ...], digest: str
    ) -> PatchFile:
        """The patch file ``name`` of ``folder`` as the index describes it (``fields``: its
        INDEXED_FIELDS); ``digest`` is the sha256 of the indexed text."""
        patch = cls.__new__(cls)
        patch._path, patch._folder, patch.name = None, folder, name
        patch.subject, patch._fields, patch.parsed, patch.paths = subject, fields, None, paths
        patch._description, patch._overlay_notes, patch._diff_start, patch._errors = "", "", 0, ()
        patch._all_fields, patch._python_paths = False, None
        patch._text = None
        patch._digest = digest
        return patch

    def __repr__(self) -> str:
        return f"PatchFile({self.name!r}, id={self._fields.get('Overlay-Id')!r})"

    @property
    def path(self) -> Path:
        if self._path is None:
            assert self._folder is not None
            self._path = self._folder / self.name
        return self._path

    def _read(self) -> None:
        """Read the rest of an indexed patch from its file, which must be the text indexed."""
        try:
            full = parse_patch(self.path, lazy=True)
        except (OSError, UnicodeDecodeError) as exc:
            raise PatchParseError(self.path, 1, f"cannot be read ({exc})") from exc
        if full.digest != self._digest:
            raise PatchParseError(
                self.path, 1, "changed on disk since this process read the series; a new process reads it again"
            )
        self._text, self._description, self._overlay_notes = full._text, full._description, full._overlay_notes
        self._diff_start, self._errors = full._diff_start, full._errors
        self._fields, self._all_fields = full._fields, True

    @property
    def fields(self) -> dict[str, str]:
        """Every DEP-3 field of the message (an indexed patch reads its file for the others)."""
        if not self._all_fields:
            self._read()
        return self._fields

    def field(self, name: str) -> str:
        """One field's value ("" if absent); one of INDEXED_FIELDS never reads the file."""
        if name in _INDEXED or self._all_fields:
            return self._fields.get(name, "")
        return self.fields.get(name, "")

    @property
    def text(self) -> str:
        if self._text is None:
            self._read()
        return self._text  # type: ignore[return-value]

    @property
    def description(self) -> str:
        """The upstream summary."""
        if self._text is None:
            self._read()
        return self._description

    @property
    def overlay_notes(self) -> str:
        if self._text is None:
            self._read()
        return self._overlay_notes

    @property
    def diff_start(self) -> int:
        if self._text is None:
            self._read()
        return self._diff_start

    @property
    def errors(self) -> tuple[str, ...]:
        if self._text is None:
            self._read()
        return self._errors

    @property
    def digest(self) -> str:
        """The sha256 of the text (hex): what a decision and the compile caches' salt are keyed on."""
        if self._digest is None:
            import hashlib  # here: an indexed patch carries its digest

            self._digest = hashlib.sha256(self.text.encode()).hexdigest()
        return self._digest

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
        if self._python_paths is None:
            self._python_paths = tuple(p for p in self.paths if p.endswith(".py"))
        return self._python_paths

    @property
    def id(self) -> str:
        return self._fields["Overlay-Id"]

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
    subject_match = re.compile(_SUBJECT, re.M).search(text, 0, blank)
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
