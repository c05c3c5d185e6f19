"""Apply unified-diff hunks to text: exact context, offsets allowed, no fuzz (``patch -F0``)."""

from __future__ import annotations

from .patchfile import FileDiff

__all__ = ["HunkMismatch", "apply_file_diff"]


class HunkMismatch(Exception):
    """A hunk's context was not found in the text."""

    def __init__(self, path: str, index: int, lineno: int) -> None:
        super().__init__(f"{path}: hunk #{index + 1} (patch line {lineno}) does not match")
        self.index = index


def _find(lines: list[str], block: list[str], expected: int, lo: int) -> int | None:
    """Index of ``block`` in ``lines`` at or after ``lo``, nearest to ``expected``."""
    n, m = len(lines), len(block)
    if m == 0:
        return min(max(expected, lo), n)
    hi = n - m
    if hi < lo:
        return None
    expected = min(max(expected, lo), hi)
    first = block[0]
    for delta in range(0, max(expected - lo, hi - expected) + 1):
        for pos in (expected - delta, expected + delta) if delta else (expected,):
            if lo <= pos <= hi and lines[pos] == first and lines[pos : pos + m] == block:
                return pos
    return None


def apply_file_diff(text: str, diff: FileDiff, reverse: bool = False) -> str:
    """Return ``text`` with ``diff`` applied (or un-applied); raise :class:`HunkMismatch`."""
    ends_with_newline = text.endswith("\n")
    lines = text.split("\n")
    if ends_with_newline:
        lines.pop()
    out: list[str] = []
    pos = 0
    offset = 0
    for index, hunk in enumerate(diff.hunks):
        before, after = hunk.side(reverse)
        start = hunk.new_start if reverse else hunk.old_start
        expected = (start - 1 if before else start) + offset
        found = _find(lines, before, expected, pos)
        if found is None:
            raise HunkMismatch(diff.path, index, hunk.lineno)
        offset = found - (start - 1 if before else start)
        out.extend(lines[pos:found])
        out.extend(after)
        pos = found + len(before)
    out.extend(lines[pos:])
    return "\n".join(out) + ("\n" if ends_with_newline else "")
