"""The one line of a failed test's report that says what went wrong (``verify``'s "without:" line).

pytest's JUnit report cuts the failure's message after a few lines; its element text holds the
whole report, with ``E`` before each line of the exception. The error that says what went wrong
is often not the first one there: torch's MultiProcessTestCase raises ``RuntimeError: Process 1
exited with error code 10 and exception:`` before the child's own traceback, DCP's
``CheckpointException ranks:dict_keys([0])`` before each rank's, dynamo's ``BackendCompilerFailed:
... raised:`` after the cause, and some errors start their message on the next line.
"""

from __future__ import annotations

import re

__all__ = ["failure_line"]

# "AssertionError: ...", "torch._dynamo.exc.BackendCompilerFailed: ...": a line that names an error
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Failed|Interrupt))(?::\s*(.*))?$")
# Errors that only announce another error, printed after them
_WRAPPER = re.compile(r"exited with error code \d+ and exception|^CheckpointException ranks:")
# pytest's marker of an exception line in a report ("E   AssertionError: ...")
_REPORT_PREFIX = re.compile(r"^E(?:\s+|$)")
_LIMIT = 200


def _lines(text: str) -> list[str]:
    return [s for s in (_REPORT_PREFIX.sub("", line).strip() for line in text.splitlines()) if s]


def _errors(lines: list[str]) -> list[tuple[int, str]]:
    """(index, ``Name: message``) of each error line; a message on the next line is joined."""
    out = []
    for i, line in enumerate(lines):
        m = _ERROR_LINE.match(line)
        if not m:
            continue
        message = m.group(2) or ""
        if not message and i + 1 < len(lines) and not _ERROR_LINE.match(lines[i + 1]):
            message = lines[i + 1]
        out.append((i, f"{m.group(1)}: {message}" if message else m.group(1)))
    return out


def _announces(error: str) -> bool:
    """Whether an error line only announces another: no message, a trailing colon, a wrapper's words."""
    _, _, message = error.partition(": ")
    return not message or message.endswith(":") or bool(_WRAPPER.search(message))


def _expected_by(lines: list[str], at: int) -> str:
    """The statement before line ``at`` that expected an error (``with self.assertRaises...``)."""
    for line in reversed(lines[:at]):
        statement = line.lstrip(">").strip().removesuffix(":")
        if "assertRaises" in statement or "raises(" in statement:
            return statement
    return ""


def failure_line(message: str, text: str) -> str:
    """What went wrong, from a JUnit failure's ``message`` and its element ``text``.

    The first error line that is not a wrapper's and has a message; else the first error line;
    else the first line of the message that does not announce another (``... raised:``).
    """
    lines = _lines(text) or _lines(message)
    errors = _errors(lines)
    telling = [(i, e) for i, e in errors if not _announces(e)]
    if telling:
        at, line = telling[0]
        if line.endswith(" not raised"):
            expected = _expected_by(lines, at)
            line += f" ({expected})" if expected else ""
    elif errors:
        line = errors[0][1]
    else:
        plain = _lines(message) or lines
        line = next((s for s in plain if not s.endswith(":")), plain[0] if plain else "")
    return line if len(line) <= _LIMIT else line[: _LIMIT - 3] + "..."
