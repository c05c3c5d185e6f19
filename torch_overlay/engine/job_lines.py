"""The lines a job prints about the overlay: which torch and how many fixes when torch is first
imported, which fixes were applied at exit, the INFO summary, and the one warning about fixes lost
to modules imported before the overlay (engine/overlay.py says them)."""

from __future__ import annotations

from collections import Counter

from .._state import PatchState
from .components import Entry

__all__ = ["job_end_line", "job_start_line", "LATE", "LATE_REMEDY", "late_warning", "summary_line"]

# The first words of the reason of a patch lost because its module ran before the overlay.
LATE = "imported too late"
LATE_REMEDY = (
    "import torch_overlay before `import torch` (which imports some patched modules itself), or start "
    "the job with torch-overlay-run"
)


def _lost(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.state == PatchState.FAILED and e.reason.startswith(LATE)]


def _late_modules(entries: list[Entry]) -> list[str]:
    """The modules imported before the overlay that cost ``entries`` (each reason names it first)."""
    out = []
    for e in entries:
        words = e.reason.split(" was imported before torch_overlay", 1)[0].split()
        if words:
            out.append(words[-1])
    return list(dict.fromkeys(out))


def late_warning(lost: list[Entry]) -> str:
    """The one warning for the fixes ``lost`` to a late import: which, the modules imported too
    early, and the remedy once (each patch's own reason is in ``status``)."""
    modules = _late_modules(lost)
    were = "was" if len(modules) == 1 else "were"
    return (
        f"torch_overlay: {len(lost)} fix{'' if len(lost) == 1 else 'es'} lost, {LATE}: {', '.join(modules)} {were} "
        f"imported before torch_overlay, so torch is left unpatched for {', '.join(e.id for e in lost)} "
        f"(`python -m torch_overlay status` says why for each). "
        f"To keep {'it' if len(lost) == 1 else 'them'}, {LATE_REMEDY}."
    )


def summary_line(entries: list[Entry], version: str) -> str:
    """``torch_overlay on torch 2.13.0: applied: a, b; upstream: c`` (logged at INFO, rank 0)."""
    counts: dict[str, list[str]] = {}
    for e in entries:
        counts.setdefault(str(e.state), []).append(e.id)
    return f"torch_overlay on torch {version}: " + "; ".join(f"{state}: {', '.join(ids)}" for state, ids in counts.items())


def job_start_line(entries: list[Entry], version: str, unmade: int = 0) -> str:
    """``torch_overlay: torch 2.13.0, 28 fixes active (7 not needed here); ...``.

    ``unmade``: patches of the series beside ``entries`` that have no entry yet (engine/roster.py),
    each pending.
    """
    active = [e for e in entries if e.state in (PatchState.PENDING, PatchState.APPLIED)]
    lost = _lost(entries)
    counted = {id(e) for e in active} | {id(e) for e in lost}  # by identity: linear in the series
    rest = Counter(str(e.state) for e in entries if id(e) not in counted)
    line = (
        f"torch_overlay: torch {version}, {len(active) + unmade} fixes active"
        + (f" (of {len(entries) + unmade}: {', '.join(f'{n} {state}' for state, n in rest.items())})" if rest else "")
        + "; each applies when torch imports its module"
    )
    if lost:
        line += f"; {len(lost)} lost: {LATE} (the warning names them)"
    return line + ". `python -m torch_overlay status` says more; TORCH_OVERLAY_QUIET=1 hides this."


def job_end_line(entries: list[Entry], rank: str, unmade: int = 0) -> str:
    """``torch_overlay: 12 fixes applied in this process: ...; 16 not used ...`` (``unmade``: as
    for :func:`job_start_line`)."""
    applied = [e.id for e in entries if e.state == PatchState.APPLIED]
    unused = len([e for e in entries if e.state == PatchState.PENDING]) + unmade
    lost = _lost(entries)
    lost_ids = {id(e) for e in lost}
    broken = [e.id for e in entries if e.state in (PatchState.DRIFT, PatchState.FAILED) and id(e) not in lost_ids]
    who = f"rank {rank}" if rank else "this process"
    head = f"{len(applied)} fix{'' if len(applied) == 1 else 'es'} applied in {who}"
    parts = [head + (f": {', '.join(applied)}" if applied else "")]
    if unused:
        parts.append(f"{unused} not used (their modules were not imported)")
    if lost:
        modules, ids = ", ".join(_late_modules(lost)), ", ".join(e.id for e in lost)
        parts.append(f"{len(lost)} lost: imported too late ({modules}): {ids}")
    if broken:
        parts.append(f"{len(broken)} drifted or failed: {', '.join(broken)}")
    return "torch_overlay: " + "; ".join(parts)
