r"""An error signature: one ``Error:`` line of a patch (or an ``errors`` entry of a looked-at report).

``Error: <fragment>`` (literal; whitespace runs match any whitespace), ``Error: re:<regex>`` (also
searched in the text with its whitespace runs made single spaces), each
optionally followed by `` | frame=<text>`` (a traceback frame's file or function contains it;
``frame=<file>.py:<function>``: that function of that file) and `` | type=<Name>`` (the exception's
type name), and `` | unless=<regex>`` (found in the error's text, it shows a cause the fix does not
cover: the answer is *possibly* at most). See docs/reference/patch-format.md, "Error signatures".

A match is *known* when the text and every qualifier match, and *possibly* when the text matches
but the error as pasted cannot show a qualifier (no frames, none of torch's frames, or no exception
class) or nearly shows it (another function of the frame qualifier's file: torch renames and
moves functions between releases); a qualifier that the error contradicts is no match at all. A
signature ending in `` | possibly`` is a message that other causes print too, with nothing in a
traceback to tell them apart: it is never more than *possibly*, and nothing at all where the error
does not show its qualifiers.

A number or name that a paste elides (``invocation index ... encountered``) matches a signature's
``\d+`` or ``\w+``, and a message wrapped in the middle of a word, or wrapped in a code comment
(each line starting with ``#`` or ``//``), matches too.

Two near fits are *possibly* at most (never for a `` | possibly`` signature): the message retold
with other quote marks or none (``with dtype BFloat16 to a tensor with grad_dtype Float``), and the
message cut short where the paste stops quoting it (the end of the text, a closing quote or ``...``)
after at least :data:`_CUT_MIN_WORDS` of its words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

__all__ = ["ErrorText", "KNOWN", "POSSIBLY", "Signature", "SignatureError", "parse_signature"]

_QUALIFIERS = ("frame", "type", "unless")
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

    @cached_property
    def flat(self) -> str:
        return " ".join(self.text.split())

    @cached_property
    def unwrapped(self) -> str:
        """The text with its line breaks and their indentation removed: a message wrapped mid-word."""
        return re.sub(r"[ \t]*\n[ \t>]*", "", self.text)

    @cached_property
    def uncommented(self) -> str:
        """:attr:`flat` of the text with the comment markers that start its lines taken out: a
        message quoted in a code comment and wrapped there (``# ... another\\n# FSDP group``)."""
        return " ".join(re.sub(r"(?m)^[ \t]*(?:#+|//+)[ \t]?", "", self.text).split())

    def torch_frames(self) -> tuple[str, ...]:
        return tuple(f for f in self.frames if re.search(r"[/\\]torch[/\\]|^File \"torch[/\\]", f))


@dataclass(frozen=True)
class Signature:
    source: str  # the line as written
    pattern: re.Pattern[str]
    frame: str | None = None
    type: str | None = None
    generic: bool = False  # `| possibly`: the text alone never makes the answer sure
    elided: re.Pattern[str] | None = None  # the pattern with `...` allowed for each number and name
    unless: re.Pattern[str] | None = None  # `| unless=`: the error also shows another cause

    @cached_property
    def exact_patterns(self) -> tuple[tuple[re.Pattern[str], str | None], ...]:
        """The message, and the message with numbers and names elided, each with its anchor."""
        return tuple((p, _anchor(p.pattern)) for p in (self.pattern, self.elided) if p is not None)

    def text_matches(self, error: ErrorText) -> bool:
        """Whether the message matches, as pasted: wrapped anywhere, numbers and names elided."""
        return _search(self.exact_patterns, (error.text, error.flat, error.unwrapped, error.uncommented))

    @cached_property
    def near_patterns(self) -> tuple[tuple[str, str | None], ...]:
        """The message with its quote marks made any quote mark or none (compiled when searched)."""
        near = _any_quotes(self.pattern.pattern)
        return ((_bounded(near), _anchor(near)),)

    @cached_property
    def cut_patterns(self) -> tuple[tuple[str, str | None], ...]:
        """The message's leading parts, each followed by where a paste stops quoting it."""
        return tuple((_bounded(cut + _CUT_END), _anchor(cut)) for cut in _cuts(self.pattern.pattern))

    def nearly_matches(self, error: ErrorText) -> bool:
        """Whether the message is retold with other quotes, or cut where the paste stops quoting it."""
        return _search(self.near_patterns, (error.text, error.flat, error.uncommented)) or _search(
            self.cut_patterns, (error.flat, error.uncommented)
        )

    def match(self, error: ErrorText) -> str | None:
        """:data:`KNOWN`, :data:`POSSIBLY` (a qualifier the error does not show, or a message
        that is only a near fit) or None."""
        exact = self.text_matches(error)
        if not exact and (self.generic or not self.nearly_matches(error)):
            return None
        sure = exact and (
            self.unless is None or not any(self.unless.search(t) for t in (error.text, error.flat, error.unwrapped))
        )
        if self.type is not None:
            if not error.types:
                sure = False
            elif self.type not in error.types:
                return None
        if self.frame is not None:
            fit = _frame_fit(self.frame, error)
            if fit is None:
                return None
            sure = sure and fit
        if self.generic:
            # A message that other causes print too: without its qualifiers it proves nothing.
            return POSSIBLY if sure else None
        return KNOWN if sure else POSSIBLY

    def matches(self, error: ErrorText) -> bool:
        """Whether the text and every qualifier match (what an exception of this process shows)."""
        return self.match(error) == KNOWN


def _search(patterns: Iterable[tuple[re.Pattern[str] | str, str | None]], texts: tuple[str, ...]) -> bool:
    """Whether a pattern is found in a text; a text without a pattern's anchor is not searched
    (a whole log without an exception line is matched as one message, megabytes long), and a
    pattern given as source is compiled only then."""
    return any(re.search(p, t) for p, anchor in patterns for t in texts if anchor is None or anchor in t)


# A piece of a regex's source that matches itself: an escaped punctuation mark, or a plain character.
_LITERAL = re.compile(r"\\[^\w\s]|[\w ,:;'\"<>=!@%&/-]")


def _anchor(pattern: str) -> str | None:
    """The longest run of literal characters (four at least) that every match of ``pattern`` holds,
    outside its groups; None where it has none, or a top-level alternative."""
    runs, run = [], ""
    tokens = list(_regex_tokens(pattern))
    for n, (_, token, depth) in enumerate(tokens):
        following = tokens[n + 1][1] if n + 1 < len(tokens) else ""
        if depth == 0 and token == "|":
            return None
        if depth or _LITERAL.fullmatch(token) is None:
            runs.append(run)
            run = ""
        elif following in ("?", "*", "+") or following.startswith("{"):
            runs.append(run)  # a repeated character (none at all, with ? or *) ends the run
            run = ""
        else:
            run += token[-1]
    runs.append(run)
    best = max(runs, key=len)
    return best if len(best) >= 4 else None


def _frame_fit(qualifier: str, error: ErrorText) -> bool | None:
    """True: a frame shows the qualifier; False: the paste cannot tell (no frames of torch's, or
    only another function of the qualifier's file); None: torch's frames shown, none of them fits."""
    file, _, function = qualifier.rpartition(":") if re.search(r"\.py:\w+$", qualifier) else ("", "", qualifier)
    if file:
        if any(file in f and re.search(rf"\bin {re.escape(function)}$", f) for f in error.frames):
            return True
    elif any(qualifier in f for f in error.frames):
        return True
    frames = error.torch_frames()
    if not frames or (file and any(file in f for f in frames)):
        return False
    return None


# A cut message: at least this many of its words, then where the paste stops quoting it (the end of
# the text, a closing quote, an ellipsis).
_CUT_MIN_WORDS = 5
_CUT_END = r"""(?=\s*(?:$|["'`‘’“”](?!\w)|\.\.\.|…))"""
_QUOTE_MARKS = "[\"'`‘’“”]?"


def _regex_tokens(pattern: str) -> Iterable[tuple[int, str, int]]:
    """Each piece of a regex's source: (start, text, group depth before it); an escape, a character
    class and a single character are one piece each."""
    depth, i = 0, 0
    while i < len(pattern):
        start = i
        if pattern[i] == "\\":
            i += 2
        elif pattern[i] == "[":
            i += 1
            i += pattern[i : i + 1] == "^"
            i += pattern[i : i + 1] == "]"  # a "]" first is a member, not the end
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        else:
            i += 1
        token = pattern[start:i]
        yield start, token, depth
        depth += (token == "(") - (token == ")")


# How far a near fit's repeat may reach: a placeholder whose quotes are made optional would
# otherwise run to the end of a whole log and back at every place its first words occur.
_NEAR_REACH = 500


def _bounded(pattern: str) -> str:
    """``pattern`` with each ``+`` and ``*`` repeat reaching :data:`_NEAR_REACH` characters at most."""
    bound = {"+": f"{{1,{_NEAR_REACH}}}", "*": f"{{0,{_NEAR_REACH}}}"}
    return "".join(bound.get(token, token) for _, token, _ in _regex_tokens(pattern))


def _any_quotes(pattern: str) -> str:
    """``pattern`` with each quote mark it asks for made any quote mark or none."""
    return "".join(
        _QUOTE_MARKS if token.lstrip("\\") in ("'", '"') else token for _, token, _ in _regex_tokens(pattern)
    )


def _cuts(pattern: str) -> list[str]:
    """The leading parts of ``pattern`` that end before a top-level space and hold at least
    :data:`_CUT_MIN_WORDS` words, shortest first (a message cut short by the paste)."""
    cuts = []
    for start, token, depth in _regex_tokens(pattern):
        if depth or token not in (" ", "\\s", "\\ "):
            continue
        head = pattern[:start]
        if len(re.findall(r"(?<!\\)\b[A-Za-z_][\w-]*", re.sub(r"\\[a-zA-Z]", " ", head))) >= _CUT_MIN_WORDS:
            cuts.append(head)  # cut outside every group and class: it compiles as the whole does
    return cuts


def _fragment_regex(fragment: str) -> str:
    return r"\s+".join(re.escape(word) for word in fragment.split())


# What a paste puts for a number or a name it leaves out.
_ELISION = r"(?:\.\.\.|…)"


def _elided(pattern: str) -> re.Pattern[str] | None:
    """``pattern`` with an elision allowed wherever it has a number or a name (None: it has none)."""
    out = re.sub(r"(?<!\\)\\([dw])\+", lambda m: rf"(?:\{m.group(1)}+|{_ELISION})", pattern)
    return re.compile(out) if out != pattern else None


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
                f"{line!r}: a qualifier is `frame=<text>`, `type=<Name>`, `unless=<regex>` or `possibly`, "
                f"not {qual.strip()!r}"
            )
        qualifiers[name] = value.strip()
    try:
        unless = re.compile(qualifiers["unless"]) if "unless" in qualifiers else None
    except re.error as exc:
        raise SignatureError(f"{line!r}: bad regular expression after unless=: {exc}") from None
    if head.startswith("re:"):
        try:
            pattern = re.compile(head[3:].strip())
        except re.error as exc:
            raise SignatureError(f"{line!r}: bad regular expression: {exc}") from None
    else:
        pattern = re.compile(_fragment_regex(head))
    if not pattern.pattern:
        raise SignatureError(f"{line!r}: no text to match")
    return Signature(
        line, pattern, qualifiers.get("frame"), qualifiers.get("type"), generic, _elided(pattern.pattern), unless
    )


def parse_signatures(lines: Iterable[str]) -> tuple[Signature, ...]:
    return tuple(parse_signature(line) for line in lines)
