"""An error signature: one ``Error:`` line of a patch (or an ``errors`` entry of a looked-at report).

``Error: <fragment>`` (literal; whitespace runs match any whitespace), ``Error: re:<regex>`` (also
searched in the text with its whitespace runs made single spaces), each
optionally followed by `` | frame=<text>`` (a traceback frame's file or function contains it) and
`` | type=<Name>`` (the exception's type name). See docs/reference/patch-format.md, "Error signatures".

A match is *known* when the text and every qualifier match, and *possibly* when the text matches
but the error as pasted cannot show a qualifier (no frames, or no exception class): a qualifier
that the error contradicts is no match at all. A signature ending in `` | possibly`` is a message
that other causes print too, with nothing in a traceback to tell them apart: it is never more than
*possibly*, and nothing at all where the error does not show its qualifiers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ErrorText", "KNOWN", "POSSIBLY", "Signature", "SignatureError", "parse_signature"]

_QUALIFIERS = ("frame", "type")
KNOWN = "known"
POSSIBLY = "possibly"


class SignatureError(ValueError):
    """An ``Error:`` line that cannot be read."""


@dataclass(frozen=True)
class ErrorText:
    """What a signature is matched against: one error of a log or one exception."""

    text: str  # "RuntimeError: message", continuation lines included (a chain: every exception's)
    types: tuple[str, ...] = ()  # the exception types' last dotted parts, e.g. ("RuntimeError",)
    frames: tuple[str, ...] = ()  # each traceback frame as printed: 'File "...", line N, in fn'

    @property
    def flat(self) -> str:
        return " ".join(self.text.split())


@dataclass(frozen=True)
class Signature:
    source: str  # the line as written
    pattern: re.Pattern[str]
    frame: str | None = None
    type: str | None = None
    generic: bool = False  # `| possibly`: the text alone never makes the answer sure

    def match(self, error: ErrorText) -> str | None:
        """:data:`KNOWN`, :data:`POSSIBLY` (a qualifier the error does not show) or None."""
        # A message may be wrapped anywhere: a regex also gets the text with whitespace runs as one space.
        if self.pattern.search(error.text) is None and self.pattern.search(error.flat) is None:
            return None
        sure = True
        if self.type is not None:
            if not error.types:
                sure = False
            elif self.type not in error.types:
                return None
        if self.frame is not None:
            if not error.frames:
                sure = False
            elif not any(self.frame in frame for frame in error.frames):
                return None
        if self.generic:
            # A message that other causes print too: without its qualifiers it proves nothing.
            return POSSIBLY if sure else None
        return KNOWN if sure else POSSIBLY

    def matches(self, error: ErrorText) -> bool:
        """Whether the text and every qualifier match (what an exception of this process shows)."""
        return self.match(error) == KNOWN


def _fragment_regex(fragment: str) -> str:
    return r"\s+".join(re.escape(word) for word in fragment.split())


def parse_signature(line: str) -> Signature:
    """Read one signature; raise :class:`SignatureError` on an empty pattern, a bad regular
    expression or an unknown qualifier."""
    head, *quals = line.split(" | ")
    head = head.strip()
    qualifiers: dict[str, str] = {}
    generic = False
    for qual in quals:
        if qual.strip() == "possibly":
            generic = True
            continue
        name, eq, value = qual.strip().partition("=")
        if not eq or name not in _QUALIFIERS or not value.strip():
            raise SignatureError(
                f"{line!r}: a qualifier is `frame=<text>`, `type=<Name>` or `possibly`, not {qual.strip()!r}"
            )
        qualifiers[name] = value.strip()
    if head.startswith("re:"):
        try:
            pattern = re.compile(head[3:].strip())
        except re.error as exc:
            raise SignatureError(f"{line!r}: bad regular expression: {exc}") from None
    else:
        pattern = re.compile(_fragment_regex(head))
    if not pattern.pattern:
        raise SignatureError(f"{line!r}: no text to match")
    return Signature(line, pattern, qualifiers.get("frame"), qualifiers.get("type"), generic)


def parse_signatures(lines: Iterable[str]) -> tuple[Signature, ...]:
    return tuple(parse_signature(line) for line in lines)
