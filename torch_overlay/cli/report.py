"""Render patch states for ``status``: a table that fits the terminal, or JSON."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

from .._state import PatchState, PatchStatus
from ..series.series import Patch
from ..series.versions import parse_version

__all__ = [
    "affected_span",
    "format_late_imports",
    "format_status",
    "short_bug",
    "status_summary",
    "to_json",
    "why_needed",
    "wrap",
]

# The states whose row says why the fix matters for this torch (the patch's fields); the others
# say why it does not apply here (the engine's reason).
_NEEDED = (PatchState.APPLIED, PatchState.PENDING, PatchState.SOURCE_ONLY, PatchState.DISABLED)
_PROBLEMS = (PatchState.DRIFT, PatchState.FAILED)
# Below this the BUG column moves to its own line under the row.
_MIN_BUG_COLUMN = 20


def to_json(rows: list[PatchStatus], **extra: object) -> str:
    return json.dumps({**extra, "patches": [r.as_dict() for r in rows]}, indent=2)


def wrap(text: str, width: int, indent: str = "", label: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` characters, the first after ``indent + label``."""
    first = indent + label
    return textwrap.wrap(
        text,
        max(width, len(first) + 20),
        initial_indent=first,
        subsequent_indent=" " * len(first),
        break_on_hyphens=False,  # keep file names and ids whole
    )


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


def affected_span(affects: str) -> str:
    """``"2.11.0, 2.12.1, 2.13.0"`` -> ``"2.11-2.13"``; a gap splits it: ``"2.11, 2.13-2.15"``."""
    minors = sorted({parse_version(v)[:2] for v in affects.split(",") if v.strip()})
    runs: list[list[tuple[int, int]]] = []
    for minor in minors:
        if runs and runs[-1][-1] == (minor[0], minor[1] - 1):
            runs[-1].append(minor)
        else:
            runs.append([minor])

    def name(minor: tuple[int, int]) -> str:
        return f"{minor[0]}.{minor[1]}"

    return ", ".join(name(r[0]) if len(r) == 1 else f"{name(r[0])}-{name(r[-1])}" for r in runs)


def _origin(fields: dict[str, str]) -> tuple[str, str]:
    """(``backport`` or ``vendor``, the upstream PR links of a backport)."""
    kind, _, source = fields.get("Origin", "").partition(",")
    return kind.strip(), source.strip()


def why_needed(fields: dict[str, str]) -> str:
    """Why a fix matters, from its patch's fields: where the bug was measured and where upstream stands.

    ``broken on 2.11-2.15, unfixed upstream``; ``broken on 2.11-2.13; backport of pytorch#1, in torch 2.14.0``.
    """
    affects, upstream = fields.get("Affects", ""), fields.get("Applied-Upstream", "")
    broken = f"broken on {affected_span(affects)}" if affects else "the releases it breaks are not recorded"
    kind, source = _origin(fields)
    if kind == "backport" and source:
        return f"{broken}; backport of {short_bug(source)}" + (f", in torch {upstream}" if upstream else ", unreleased")
    text = f"{broken}, " + (f"fixed upstream in torch {upstream}" if upstream else "unfixed upstream")
    forwarded = fields.get("Forwarded", "")
    return text + (f"; proposed upstream as {short_bug(forwarded)}" if forwarded.startswith("https://") else "")


def _bug(row: PatchStatus, patch: Patch | None) -> str:
    """The BUG cell: the bug links, else a backport's upstream PR, else "found here"."""
    if row.bug.strip():
        return short_bug(row.bug)
    kind, source = _origin(patch.main.fields) if patch and patch.main else ("", "")
    return short_bug(source) if kind == "backport" and source else "found here"


def _details(row: PatchStatus, patch: Patch | None, state: str | None, bug: str | None) -> list[tuple[str, str]]:
    """The (label, text) lines under a row: title, state and bug (when not in the table), why, what it changes."""
    fields = patch.main.fields if patch and patch.main else {}
    out = [("", row.title)]
    if state is not None:
        out.append(("state: ", state))
    if bug is not None:
        out.append(("bug: ", bug))
    out.append(("why: ", why_needed(fields) if row.state in _NEEDED and fields else row.reason or "-"))
    if row.state == PatchState.APPLIED:
        # The engine's reason for an applied patch: "<variant file>: <changed functions>".
        changed = row.reason.removeprefix(f"{row.variant}: ") if row.variant else row.reason
        files = ", ".join(t.path for t in row.targets)
        by = f" (by {row.variant})" if patch and patch.main and row.variant != patch.main.path.name else ""
        out.append(("changes: ", f"{changed} in {files}{by}"))
    elif row.state in _NEEDED:
        out.append(("off: " if row.state == PatchState.DISABLED else "now: ", row.reason or "-"))
    if patch and patch.main and not row.bug.strip() and _bug(row, patch) == "found here":
        # The patch's description is the PR text `./build.sh stage` files upstream.
        main = patch.main.path
        filed = " (not filed upstream yet)" if fields.get("Forwarded", "no") == "no" else ""
        out.append(("PR text: ", f"{main.parent.name}/{main.name}{filed}"))
    return out


def format_status(rows: list[PatchStatus], patches: dict[str, Patch], width: int) -> str:
    """A row per patch (id, state, bug), then its title, why it matters here and what it changes,
    indented; no line longer than ``width``: a column that does not fit moves under the row."""
    cells = [(r.id, f"{r.state} ({r.mode})" if r.mode else str(r.state), _bug(r, patches.get(r.id))) for r in rows]
    id_w = max([2] + [len(c[0]) for c in cells])
    state_w = max([5] + [len(c[1]) for c in cells])
    lead = id_w + state_w + 4
    state_column = id_w + 2 + state_w <= width
    bug_column = state_column and width - lead >= _MIN_BUG_COLUMN
    header = ["ID".ljust(id_w)] + ["STATE".ljust(state_w)] * state_column + ["BUG"] * bug_column
    lines = ["  ".join(header).rstrip()]
    for row, (pid, state, bug) in zip(rows, cells):
        if bug_column:
            first, *more = textwrap.wrap(bug, width - lead, break_on_hyphens=False) or ["-"]
            lines.append(f"{pid.ljust(id_w)}  {state.ljust(state_w)}  {first}")
            lines.extend(" " * lead + m for m in more)
        else:
            lines.append(f"{pid.ljust(id_w)}  {state}".rstrip() if state_column else pid)
        details = _details(row, patches.get(row.id), None if state_column else state, None if bug_column else bug)
        for label, text in details:
            lines.extend(wrap(text, width, "    ", label))
    return "\n".join(lines)


def status_summary(rows: list[PatchStatus], problems: int) -> str:
    """``28 patches: 20 applied, 6 upstream, 2 not needed; 0 problems`` (drift, failed, the overlay's own)."""
    counts = Counter(r.state for r in rows)
    states = ", ".join(f"{counts[s]} {s}" for s in PatchState if counts[s])
    bad = problems + sum(counts[s] for s in _PROBLEMS)
    return f"{len(rows)} patches: {states or 'none'}; {bad} problem{'' if bad == 1 else 's'}"


def format_late_imports(probe: dict) -> str:
    """What a script that imports torch before torch_overlay loses here (``late_import_probe``)."""
    loaded, lost, swapped = probe["imported_by_import_torch"], probe["lost"], probe["swapped"]
    text = (
        "import order: put `import torch_overlay` before `import torch`. A plain `import torch` imports "
        f"{', '.join(loaded) or 'no patched module'}: imported first, it costs "
        + (f"{', '.join(lost)} (imported too late)" if lost else "no fix on this torch")
    )
    if swapped:
        text += f" ({', '.join(swapped)}: changed functions swapped in)"
    if not lost:
        text += ", but torch's other patched modules (FSDP, DTensor, inductor...) imported before the overlay do"
    return text + ". torch-overlay-run imports the overlay first in every process of a job."
