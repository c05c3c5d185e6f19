"""Find the distinct errors in a traceback or a whole job log.

A log may interleave ranks (torchrun's ``[rank0]:`` or ``[default0]:`` prefixes), carry ANSI
colour, chained exceptions and torchelastic's ``ChildFailedError`` summary, which repeats each
failed rank's traceback. Each Python traceback gives one error (its chain's exception lines and
frames); C++ log records of level E or F (an NCCL watchdog timeout) give one each. Errors with the
same text up to numbers are one error, seen on several ranks.

People paste errors in other shapes than a log, and each is read as the error it shows: inside
markdown (code fences, inline backticks, bold, ``>`` quotes, list items), behind pytest's ``E``
prefix, doubled rank prefixes or anything before a rank prefix (a host, an IP, a timestamp), in
quote marks or as the exception's repr (``RuntimeError('...')``), frames without their
``Traceback`` header or after the message, a message mid-sentence ("... crashed with:
RuntimeError: ..."), an exception class that does not end in ``Error``
(``torch._dynamo.exc.FailOnRecompileLimitHit``), a frame line wrapped in two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .signatures import ErrorText

__all__ = ["LoggedError", "find_errors", "message_only"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# Whatever a launcher or a log collector puts first (a host, an IP, a timestamp, srun's "0: "),
# then the rank prefixes.
_RANK_PREFIX = re.compile(r"^[^\n]{0,120}?(?:\[(?:rank|default)(\d+)\]:[ ]?)+")
# A message quoted as a string: in quote marks, or as the exception's repr (RuntimeError('...')).
_QUOTED = re.compile(r"""^\s*["'“‘]((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*: .*?)["'”’]?[.,]?\s*$""")
_REPR = re.compile(r"""^\s*((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception))\((["'])(.*)\2\)[.,]?\s*$""")
# Markdown and pytest around a pasted line: a quote marker, pytest's "E   " failure prefix.
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_PYTEST_E = re.compile(r"^E(?: {1,7}|$)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_TRACEBACK = "Traceback (most recent call last):"
_CHAIN = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_CLASS_SUFFIX = r"(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout|Hit|Unsupported)"
_EXCEPTION = re.compile(rf"^([A-Za-z_][\w.]*{_CLASS_SUFFIX}|[A-Za-z_][\w]*\.[\w.]*[A-Z]\w*)(?::[ ]?(.*))?$")
# An exception line pasted alone, or mid-sentence: a class named like one, then ": message" (a
# warning printed by the warnings module is not an error).
_ERROR_SUFFIX = r"(?:Error|Exception|Interrupt|Timeout|Failure|Hit|Unsupported)"
_BARE_EXCEPTION = re.compile(rf"^([A-Za-z_][\w.]*{_ERROR_SUFFIX})(?::[ ]?(.*))?$|^((?:[a-z_]\w*\.)+[A-Z]\w*): (.*)$")
_INLINE_EXCEPTION = re.compile(rf"(?<![\w.])((?:[a-z_]\w*\.)*[A-Z]\w*{_ERROR_SUFFIX}|(?:[a-z_]\w*\.)+[A-Z]\w*): \S")
_CPP_ERROR = re.compile(r"^\[?[EF]\d{4} [\d:.]+ +(?:\d+ )?[^\]]+\.(?:cpp|cc|h|hpp|cu):\d+\] (.*)$")
# Where a message's continuation lines stop: another record or a torchelastic line.
_RECORD = re.compile(r"^(\[?[WIEF]\d{4} |\[[WIEF] |(WARNING|INFO|ERROR|DEBUG):|=+$|-+$|E\d{4} )")
_WRAPPERS = ("ChildFailedError",)
_MAX_MESSAGE_LINES = 60


@dataclass
class LoggedError:
    type: str  # the last exception's type as printed ("torch._dynamo.exc.BackendCompilerFailed"), "" for a log record
    message: str  # its message, continuation lines included
    chain: tuple[str, ...] = ()  # every exception line of the chain, outermost cause first
    frames: tuple[str, ...] = ()
    ranks: list[str] = field(default_factory=list)

    @property
    def headline(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first}" if self.type else first

    def as_error_text(self) -> ErrorText:
        if not self.type:  # a C++ record, or a message pasted without its exception class
            return ErrorText("\n".join(self.chain), (), self.frames)
        types = tuple(line.partition(":")[0].rsplit(".", 1)[-1] for line in self.chain)
        return ErrorText("\n".join(self.chain), types, self.frames)

    def key(self) -> tuple[str, str]:
        """What two reports of one error share: the type's name and the message's first line,
        numbers and addresses aside (a rank's copy may be cut or wrapped differently)."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return (self.type.rsplit(".", 1)[-1], re.sub(r"0x[0-9a-f]+|\d+", "#", " ".join(first.split())))


def _unpasted(line: str) -> list[str]:
    """``line`` without what pasting it added (markdown, pytest's prefix): one line, or two where
    an exception line starts mid-sentence."""
    if _FENCE.match(line):
        return [""]
    line = _PYTEST_E.sub("", _QUOTE.sub("", line))
    line = line.replace("**", "").replace("\\`", "").replace("`", "")
    if quoted := _QUOTED.match(line):
        line = quoted.group(1)
    elif repr_form := _REPR.match(line):
        line = f"{repr_form.group(1)}: {repr_form.group(3)}"
    stripped = line.strip()
    if _LIST_ITEM.match(line) and (_BARE_EXCEPTION.match(_LIST_ITEM.sub("", line)) or 'File "' in line):
        return [_LIST_ITEM.sub("", line)]
    if stripped.startswith(("File ", _TRACEBACK)) or _EXCEPTION.match(stripped):
        return [line]
    inline = _INLINE_EXCEPTION.search(line)
    if inline and inline.start() > 0:
        return [line[: inline.start()], line[inline.start() :]]
    return [line]


def _streams(text: str) -> dict[str | None, list[str]]:
    """The log's lines per rank (None: lines without a rank prefix), in order, unpasted."""
    streams: dict[str | None, list[str]] = {}
    for raw in _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        match = _RANK_PREFIX.match(raw)
        rank = match.group(1) if match else None
        lines = streams.setdefault(rank, [])
        for line in _unpasted(raw[match.end() :] if match else raw):
            # A frame line wrapped before its function: 'File "x.py", line 7,' / 'in f'.
            if lines and re.match(r'^\s*File ".*", line \d+,$', lines[-1]) and line.strip().startswith("in "):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line)
    return streams


def _message(lines: list[str], start: int, first: str) -> tuple[str, int]:
    """The message beginning with ``first`` at ``lines[start]``, and the index after it."""
    parts = [first]
    i = start + 1
    while i < len(lines) and len(parts) < _MAX_MESSAGE_LINES:
        line = lines[i]
        if line.startswith(_TRACEBACK) or line.strip() in _CHAIN or _RECORD.match(line.strip()):
            break
        if line.strip().startswith('File "'):  # frames pasted after their message
            break
        if not line.strip() and (i + 1 >= len(lines) or not lines[i + 1].strip() or lines[i + 1].strip() in _CHAIN):
            break
        parts.append(line)
        i += 1
    return "\n".join(parts).rstrip(), i


def _parse_traceback(lines: list[str], i: int) -> tuple[LoggedError | None, int]:
    """The error of the traceback chain starting at ``lines[i]`` (a ``Traceback`` line)."""
    chain: list[str] = []
    frames: list[str] = []
    last_type, last_message = "", ""
    while i < len(lines) and lines[i].strip().startswith(_TRACEBACK):
        indent = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        while i < len(lines):  # frames: indented deeper than the Traceback line
            line = lines[i]
            stripped = line.strip()
            if stripped.startswith("File "):
                frames.append(stripped)
            elif stripped and len(line) - len(line.lstrip()) <= indent and not stripped.startswith(("^", "~")):
                break
            i += 1
        if i >= len(lines):
            break
        head = lines[i].strip()
        match = _EXCEPTION.match(head) or re.match(r"^([A-Za-z_][\w.]*)(?::[ ]?(.*))?$", head)
        if not match:
            break
        last_type = match.group(1)
        last_message, i = _message(lines, i, match.group(2) or "")
        chain.append(f"{last_type}: {last_message}" if last_message else last_type)
        # A chain: a blank line, the chain sentence, a blank line, the next traceback.
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].strip() in _CHAIN:
            j += 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].strip().startswith(_TRACEBACK):
                i = j
                continue
        break
    if not chain:
        return None, i
    return LoggedError(last_type, last_message, tuple(chain), tuple(frames)), i


def _loose_frames(lines: list[str], start: int, stop: int) -> list[str]:
    """The frame lines of ``lines[start:stop]`` (frames pasted without a Traceback header)."""
    return [line.strip() for line in lines[start:stop] if line.strip().startswith('File "')]


def _frames_after(lines: list[str], i: int) -> tuple[list[str], int]:
    """Frames pasted after their message (indented, or ``File`` lines), and the index after them."""
    frames: list[str] = []
    j = i
    while j < len(lines):
        stripped = lines[j].strip()
        if stripped.startswith('File "'):
            frames.append(stripped)
        elif stripped and not lines[j].startswith((" ", "\t")):
            break
        j += 1
    return frames, (j if frames else i)


def _errors_of_stream(lines: list[str]) -> list[LoggedError]:
    found: list[LoggedError] = []
    i = 0
    since = 0  # where the lines not yet part of an error begin
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(_TRACEBACK):
            error, i = _parse_traceback(lines, i)
            if error is not None:
                found.append(error)
            since = i
            continue
        record = _CPP_ERROR.match(stripped)
        if record:
            found.append(LoggedError("", record.group(1), (record.group(1),)))
            since = i + 1
        else:
            bare = _BARE_EXCEPTION.match(stripped)
            if bare:
                name, first = (bare.group(1), bare.group(2)) if bare.group(1) else (bare.group(3), bare.group(4))
                before = _loose_frames(lines, since, i)
                message, i = _message(lines, i, first or "")
                after, i = _frames_after(lines, i)
                chain = (f"{name}: {message}" if message else name,)
                found.append(LoggedError(name, message, chain, tuple(before + after)))
                since = i
                continue
        i += 1
    return found


def _summary_tracebacks(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The tracebacks that torchelastic's ``ChildFailedError`` summary repeats, with their rank."""
    out: list[tuple[str | None, list[str]]] = []
    rank: str | None = None
    current: list[str] | None = None
    for line in lines:
        stripped = line.strip()
        if current is not None:
            if re.match(r"^(-{4,}|={4,}|\[\d+\]:|Root Cause)", stripped):
                current = None
            else:
                current.append(line[2:] if line.startswith("  ") else line)
                continue
        m = re.match(r"rank\s*:\s*(\d+)", stripped)
        if m:
            rank = m.group(1)
        elif re.match(r"traceback\s*:\s*" + re.escape(_TRACEBACK), stripped):
            current = [_TRACEBACK]
            out.append((rank, current))
    return out


def find_errors(text: str) -> list[LoggedError]:
    """The distinct errors of ``text``, in order of first appearance, each with the ranks that
    raised it (empty when the log has no rank prefixes)."""
    distinct: dict[tuple[str, str], LoggedError] = {}

    def add(error: LoggedError, rank: str | None) -> None:
        seen = distinct.setdefault(error.key(), error)
        if rank is not None and rank not in seen.ranks:
            seen.ranks.append(rank)

    for rank, lines in _streams(text).items():
        wrapped = False
        for error in _errors_of_stream(lines):
            if error.type.rsplit(".", 1)[-1] in _WRAPPERS:
                wrapped = True  # a summary of the ranks' failures, not an error of its own
                continue
            add(error, rank)
        if wrapped:
            for child_rank, child_lines in _summary_tracebacks(lines):
                for child in _errors_of_stream(child_lines):
                    add(child, child_rank)
    for error in distinct.values():
        error.ranks.sort(key=int)
    return list(distinct.values())


def message_only(text: str) -> LoggedError | None:
    """The whole of ``text`` as one error without an exception class: what a post that quotes a
    message without its class can be matched as (signatures then cannot check a type or frame)."""
    lines = [line for lines in _streams(text).values() for line in lines]
    body = "\n".join(lines).strip()
    if not body:
        return None
    frames = tuple(_loose_frames(lines, 0, len(lines)))
    return LoggedError("", body, (body,), frames)
