"""Find the distinct errors in a traceback or a whole job log.

A log may interleave ranks (torchrun's ``[rank0]:`` or ``[default0]:`` prefixes), carry ANSI
colour, chained exceptions and torchelastic's ``ChildFailedError`` summary, which repeats each
failed rank's traceback. Each Python traceback gives one error (its chain's exception lines and
frames); C++ log records of level E or F (an NCCL watchdog timeout) give one each. Errors with the
same text up to numbers are one error, seen on several ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .signatures import ErrorText

__all__ = ["LoggedError", "find_errors"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:[ ]?")
_TRACEBACK = "Traceback (most recent call last):"
_CHAIN = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout)|[A-Za-z_][\w]*\.[\w.]*[A-Z]\w*)(?::[ ]?(.*))?$")
_BARE_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception))(?::[ ]?(.*))?$")
# A C++ log record (glog style) of level E or F: "[E1127 10:00:00.000 123 File.cpp:10] text".
_CPP_ERROR = re.compile(r"^\[?[EF]\d{4} [\d:.]+ +\d+ [^\]]+\.(?:cpp|cc|h|hpp|cu):\d+\] (.*)$")
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
        types = tuple(line.partition(":")[0].rsplit(".", 1)[-1] for line in self.chain)
        return ErrorText("\n".join(self.chain), types, self.frames)

    def key(self) -> tuple[str, str]:
        return (self.type, re.sub(r"0x[0-9a-f]+|\d+", "#", " ".join(self.message.split())))


def _streams(text: str) -> dict[str | None, list[str]]:
    """The log's lines per rank (None: lines without a rank prefix), in order."""
    streams: dict[str | None, list[str]] = {}
    for raw in _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        match = _RANK_PREFIX.match(raw)
        rank = match.group(1) if match else None
        streams.setdefault(rank, []).append(raw[match.end() :] if match else raw)
    return streams


def _message(lines: list[str], start: int, first: str) -> tuple[str, int]:
    """The message beginning with ``first`` at ``lines[start]``, and the index after it."""
    parts = [first]
    i = start + 1
    while i < len(lines) and len(parts) < _MAX_MESSAGE_LINES:
        line = lines[i]
        if line.startswith(_TRACEBACK) or line.strip() in _CHAIN or _RECORD.match(line.strip()):
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


def _errors_of_stream(lines: list[str]) -> list[LoggedError]:
    found: list[LoggedError] = []
    saw_traceback = any(line.strip().startswith(_TRACEBACK) for line in lines)
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(_TRACEBACK):
            error, i = _parse_traceback(lines, i)
            if error is not None:
                found.append(error)
            continue
        record = _CPP_ERROR.match(stripped)
        if record:
            found.append(LoggedError("", record.group(1), (record.group(1),)))
        elif not saw_traceback:  # a pasted exception line alone
            bare = _BARE_EXCEPTION.match(stripped)
            if bare:
                message, i = _message(lines, i, bare.group(2) or "")
                found.append(LoggedError(bare.group(1), message, (f"{bare.group(1)}: {message}",)))
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
