"""A diff's hunks: parse them (when a patch is first decided) and apply them to text: exact
context, offsets allowed, no fuzz (``patch -F0``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .._state import Target
from .diff_header import diff_path, PatchParseError


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


__all__ = ["apply_file_diff", "FileDiff", "Hunk", "HunkMismatch", "parse_diff"]

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class HunkMismatch(Exception):
    """A hunk's context was not found in the text."""

    def __init__(self, path: str, index: int, lineno: int) -> None:
        super().__init__(f"{path}: hunk #{index + 1} (patch line {lineno}) does not match")
        self.index = index


def _find(text: str, lines: list[str], block: list[str], expected: int, lo: int) -> int | None:
    """Index of ``block`` in ``lines`` (``text`` split at newlines) at or after ``lo``, nearest to
    ``expected`` (the lower one on a tie).

    The block is searched in ``text`` with ``str.find`` (torch's files are thousands of lines, and
    a reverse-apply check that fails scans all of them).
    """
    n, m = len(lines), len(block)
    if m == 0:
        return min(max(expected, lo), n)
    hi = n - m
    if hi < lo:
        return None
    expected = min(max(expected, lo), hi)
    needle = "\n".join(block)
    best: int | None = None
    at = text.find(needle)
    while at != -1:
        end = at + len(needle)
        if (at == 0 or text[at - 1] == "\n") and (end == len(text) or text[end] == "\n"):
            pos = text.count("\n", 0, at)
            if lo <= pos <= hi and (best is None or abs(pos - expected) < abs(best - expected)):
                best = pos
            if pos > expected:  # later matches are farther away
                break
        at = text.find(needle, at + 1)
    return best


def apply_file_diff(text: str, diff: FileDiff, reverse: bool = False) -> str:
    """Return ``text`` with ``diff`` applied (or un-applied); raise :class:`HunkMismatch`."""
    ends_with_newline = text.endswith("\n")
    body = text[:-1] if ends_with_newline else text
    lines = body.split("\n")
    out: list[str] = []
    pos = 0
    offset = 0
    for index, hunk in enumerate(diff.hunks):
        before, after = hunk.side(reverse)
        start = hunk.new_start if reverse else hunk.old_start
        expected = (start - 1 if before else start) + offset
        found = _find(body, lines, before, expected, pos)
        if found is None:
            raise HunkMismatch(diff.path, index, hunk.lineno)
        offset = found - (start - 1 if before else start)
        out.extend(lines[pos:found])
        out.extend(after)
        pos = found + len(before)
    out.extend(lines[pos:])
    return "\n".join(out) + ("\n" if ends_with_newline else "")


def parse_diff(path: Path, lines: list[str], i: int) -> tuple[FileDiff, ...]:
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
            old = diff_path(line[4:], i + 1, path)
            new = diff_path(lines[i + 1][4:], i + 2, path)
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
