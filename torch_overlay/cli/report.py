"""Render patch states as a table or JSON."""

from __future__ import annotations

import json
import shutil
import textwrap

from .._state import PatchStatus

__all__ = ["format_status", "format_table", "short_bug", "to_json"]


def to_json(rows: list[PatchStatus], **extra: object) -> str:
    return json.dumps({**extra, "patches": [r.as_dict() for r in rows]}, indent=2)


def format_table(headers: list[str], rows: list[list[str]], wrap_last: bool = True) -> str:
    """A plain-text table; the last column wraps to the terminal width."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lead = sum(widths[:-1]) + 2 * (len(headers) - 1)
    total = shutil.get_terminal_size((160, 24)).columns
    last_width = max(30, total - lead) if wrap_last else 10**6
    out = []

    def emit(cells: list[str]) -> None:
        last = textwrap.wrap(cells[-1], last_width) or [""]
        first = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths[:-1]))
        out.append(f"{first}  {last[0]}".rstrip())
        for more in last[1:]:
            out.append(" " * (lead + 2) + more)

    emit(headers)
    emit(["-" * w for w in widths[:-1]] + ["-" * min(len(headers[-1]) + 10, last_width)])
    for row in rows:
        emit(row)
    return "\n".join(out)


def short_bug(urls: str) -> str:
    """``https://github.com/pytorch/pytorch/issues/1`` -> ``pytorch#1`` (comma lists too)."""
    out = []
    for url in filter(None, (u.strip() for u in urls.split(","))):
        parts = url.rstrip("/").split("/")
        if len(parts) >= 4 and parts[-2] in ("issues", "pull"):
            out.append(f"{parts[-3]}#{parts[-1]}")
        else:
            out.append(url)
    return ", ".join(out) or "-"


def format_status(rows: list[PatchStatus]) -> str:
    """One line per patch (id, state, bug, target), then its title and why, indented."""
    table = [
        [r.id, f"{r.state} ({r.mode})" if r.mode else str(r.state), short_bug(r.bug), ", ".join(t.path for t in r.targets)]
        for r in rows
    ]
    widths = [max([len(h)] + [len(t[i]) for t in table]) for i, h in enumerate(("ID", "STATE", "BUG", "TARGET"))]
    width = shutil.get_terminal_size((120, 24)).columns - 8
    lines = ["  ".join(h.ljust(w) for h, w in zip(("ID", "STATE", "BUG", "TARGET"), widths)).rstrip()]
    for row, cells in zip(rows, table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        lines.extend(textwrap.wrap(row.title, width, initial_indent="    ", subsequent_indent="    "))
        lines.extend(textwrap.wrap(row.reason or "-", width, initial_indent="    why: ", subsequent_indent="         "))
    return "\n".join(lines)
