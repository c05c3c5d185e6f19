"""``build.sh matrix``: each fix on each supported torch, measured, against what its fields say.

``build.sh`` runs ``status --json`` and ``verify --quick --needed --json`` in each torch's private
venv and hands the reports here: one cell per fix and torch, written to ``docs/measurements/matrix.md``. A
cell that contradicts the patch's fields (``Affects``, ``Introduced``, ``Applied-Upstream``) is
listed and fails the run, as does a fix that does not fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..cli.verify import Kind
from ..series.series import Patch
from ..series.versions import parse_version

__all__ = ["Cell", "measure", "render", "run_matrix"]

BUG = "bug present"  # fails without the overlay, passes with it
NOT_NEEDED = "not needed"
UPSTREAM = "upstream"
PASSES = "passes without"  # applied, but the reproducer passes without the overlay
NOT_FIXED = "NOT FIXED"
NOT_RUN = "could not run"
SOURCE_ONLY = "source only"  # a C++ fix: only a source build carries it, the runtime cannot test it


@dataclass(frozen=True)
class Cell:
    word: str  # one of the words above
    detail: str = ""


def _release(version: str) -> str:
    return ".".join(map(str, parse_version(version)))


def measure(status: dict, verify: dict) -> dict[str, Cell]:
    """One torch's cells from its ``status --json`` and ``verify --json`` reports."""
    verdicts = {v["id"]: v for v in verify.get("verdicts", [])}
    cells: dict[str, Cell] = {}
    for row in status["patches"]:
        pid, state = row["id"], row["state"]
        if state in ("upstream", "not needed", "source only"):
            word = {"upstream": UPSTREAM, "not needed": NOT_NEEDED}.get(state, SOURCE_ONLY)
            cells[pid] = Cell(word, row["reason"])
            continue
        verdict = verdicts.get(pid)
        if state != "applied" or verdict is None:
            cells[pid] = Cell(NOT_RUN, f"{state}: {row['reason']}" if verdict is None else verdict["verdict"])
            continue
        kind, text = verdict["kind"], verdict["verdict"]
        if kind == Kind.FIXED:
            cells[pid] = Cell(BUG)
        elif kind == Kind.NOT_NEEDED:
            cells[pid] = Cell(PASSES, "the Quick-Test passes without the overlay")
        elif kind in (Kind.NOT_FIXED, Kind.REGRESSION):
            cells[pid] = Cell(NOT_FIXED, text)
        else:
            cells[pid] = Cell(NOT_RUN, text)
    return cells


def contradictions(patch: Patch, version: str, cell: Cell) -> list[str]:
    """What the measured ``cell`` says against ``patch``'s fields on torch ``version``."""
    fields = patch.main.fields if patch.main else {}
    affects = {a.strip() for a in fields.get("Affects", "").split(",") if a.strip()}
    release = _release(version)
    out = []
    if cell.word == NOT_FIXED:
        out.append(f"{patch.id} on {release}: {cell.detail}")
    if cell.word == BUG and release not in affects:
        out.append(f"{patch.id} on {release}: the bug is present, but Affects ({', '.join(sorted(affects))}) omits it")
    if cell.word in (PASSES, UPSTREAM, NOT_NEEDED) and release in affects:
        why = {PASSES: "the reproducer passes without the overlay", UPSTREAM: "status says upstream"}.get(
            cell.word, "status says not needed"
        )
        out.append(f"{patch.id} on {release}: Affects lists it, but {why}")
    return out


def render(patches: list[Patch], columns: dict[str, dict[str, Cell]]) -> str:
    """The Markdown table, fixes by torch release, with the legend."""
    versions = sorted(columns, key=parse_version)
    head = ["fix", *(_release(v) for v in versions)]
    lines = [
        "# Fixes × torch, measured",
        "",
        "Written by `./build.sh matrix`: for each torch, `python -m torch_overlay status --json` and",
        "`verify --quick --needed` (each fix's Quick-Test without and with the overlay) in that torch's",
        "private venv, on the CPU. Cells: **bug present** (fails without the overlay, passes with it),",
        "*upstream* (the installed torch has the fix), *not needed* (older than the bug),",
        "*passes without* (the fix applies, but its Quick-Test passes without it), **NOT FIXED**,",
        "*source only* (a fix in C++ alone: only a source build carries it).",
        "The run fails when a cell contradicts a patch's `Affects`, `Introduced` or `Applied-Upstream`.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    for patch in patches:
        row = [f"`{patch.id}`"]
        for v in versions:
            cell = columns[v].get(patch.id)
            word = cell.word if cell else "-"
            row.append(f"**{word}**" if word in (BUG, NOT_FIXED) else word)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "torch builds: " + ", ".join(versions), ""]
    return "\n".join(lines)


def run_matrix(reports: list[Path], patches: list[Patch], out: Path) -> int:
    """Read ``<version>.status.json`` / ``<version>.verify.json`` pairs, write ``out``; exit status."""
    columns: dict[str, dict[str, Cell]] = {}
    for status_file in sorted(p for p in reports if p.name.endswith(".status.json")):
        status = json.loads(status_file.read_text())
        verify_file = status_file.with_name(status_file.name.replace(".status.json", ".verify.json"))
        verify = json.loads(verify_file.read_text()) if verify_file.is_file() else {}
        columns[status["torch"]] = measure(status, verify)
    problems = [
        line
        for version, cells in columns.items()
        for patch in patches
        if patch.id in cells
        for line in contradictions(patch, version, cells[patch.id])
    ]
    out.write_text(render(patches, columns))
    print(
        f"wrote {out}: {len(patches)} fixes on torch {', '.join(_release(v) for v in sorted(columns, key=parse_version))}"
    )
    for line in problems:
        print(f"contradiction: {line}")
    return 1 if problems else 0
