"""The lines a job prints about the overlay: which torch and how many fixes when torch is first
imported, which fixes were applied at exit, the INFO summary, and the one warning about fixes lost
to modules imported before the overlay (engine/overlay.py says them)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager
from typing import Any, TYPE_CHECKING

from .._state import PatchState
from ..series.versions import torch_version
from .components import Entry
from .once_per_job import claim_exit_line, says, tell

if TYPE_CHECKING:
    from .roster import Roster

__all__ = [
    "JobVoice",
    "job_end_line",
    "job_start_line",
    "LATE",
    "LATE_REMEDY",
    "late_warning",
    "reach_part",
    "silent_note",
    "summary_line",
]

# A torchrun agent (it starts the ranks, which say the job's lines themselves).
_AGENT_MODULE = "torch.distributed.launcher.api"
# The first words of the reason of a patch lost because its module ran before the overlay.
LATE = "imported too late"
LATE_REMEDY = (
    "import torch_overlay before `import torch` (which imports some patched modules itself), or start "
    "the job with torch-overlay-run"
)


def _lost(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.state == PatchState.FAILED and e.late]


def _late_modules(entries: list[Entry]) -> list[str]:
    """The modules imported before the overlay that cost ``entries``."""
    return list(dict.fromkeys(e.late for e in entries if e.late))


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
    return f"torch_overlay on torch {version}: " + "; ".join(
        f"{state}: {', '.join(ids)}" for state, ids in counts.items()
    )


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


def silent_note(entry: Entry) -> str:
    """The fix's ``Silent:`` field: what a run without it does, where its bug says nothing."""
    try:
        if entry.variant is not None and entry.variant.field("Silent"):
            return entry.variant.field("Silent")
        main = entry.patch.main
        return main.field("Silent") if main is not None else ""
    except Exception:  # noqa: BLE001 - said at exit: a patch file changed since is no reason to fail
        return ""


def reach_part(reach: list[dict[str, Any]]) -> str:
    """``changed code run: a (3 calls), b (1200 calls; without the overlay: ...); not run: 10 fixes``
    (``reach``: :meth:`.reach.Reach.report`'s rows)."""
    ran = [r for r in reach if r["calls"]]
    idle = [r for r in reach if r["calls"] == 0]
    unwatched = [r for r in reach if r["calls"] is None]

    def said(row: dict[str, Any]) -> str:
        calls = f"{row['calls']} call{'' if row['calls'] == 1 else 's'}"
        return f"{row['id']} ({calls}" + (f"; without the overlay: {row['silent']})" if row["silent"] else ")")

    part = f"changed code run by {len(ran)} fix{'' if len(ran) == 1 else 'es'}" + (
        f": {', '.join(said(r) for r in ran)}" if ran else ""
    )
    if idle:
        part += f"; not run by the other {len(idle)}"
    if unwatched:
        part += f"; {len(unwatched)} changed definitions only (not counted)"
    return part


def job_end_line(entries: list[Entry], rank: str, unmade: int = 0, reach: list[dict[str, Any]] | None = None) -> str:
    """``torch_overlay: 12 fixes applied in this process: ...; 16 not used ...`` (``unmade``: as
    for :func:`job_start_line`); with ``reach`` (TORCH_OVERLAY_REACH=1), which fixes' changed code ran."""
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
    if reach is not None:
        parts.append(reach_part(reach))
    return "torch_overlay: " + "; ".join(parts)


class JobVoice:
    """Says the job's two lines for one overlay: the first when torch is first imported (one process
    of the job says it), the last at exit (the process that claimed it: rank 0, or the job's only one).

    ``roster`` and ``reach`` (the reach report, None when not counted) are called when a line is said,
    under ``lock``: the overlay's state then.
    """

    def __init__(
        self,
        environ: MutableMapping[str, str] | None,
        enabled: bool,
        lock: AbstractContextManager[Any],
        roster: Callable[[], Roster],
        reach: Callable[[], list[dict[str, Any]] | None],
    ) -> None:
        self.environ = environ  # the process's own environment (children learn what was said), or None
        self.enabled = enabled and environ is not None
        self._lock = lock
        self._roster = roster
        self._reach = reach
        self._started = False
        self._says_exit_line = False

    def claim_exit_line(self) -> None:
        """At activation: this process says the exit line if no process of the job said it will."""
        if self.enabled and self.environ is not None and claim_exit_line(self.environ):
            import atexit

            self._says_exit_line = True
            atexit.register(self.end)

    def start(self) -> None:
        """When torch is first imported: one line per job saying that the overlay changes it."""
        if self._started or not self.enabled:
            return
        self._started = True
        with self._lock:
            roster = self._roster()
            line = job_start_line(roster.made(), torch_version(), unmade=roster.unmade())
        if says(line, self.environ):
            tell(line)

    def end(self) -> None:
        """At exit (rank 0, or the job's one process): which fixes this process actually applied."""
        if not (self._started and self.enabled and self._says_exit_line) or _AGENT_MODULE in sys.modules:
            return
        with self._lock:
            roster = self._roster()
            line = job_end_line(roster.made(), os.environ.get("RANK", "").strip(), roster.unmade(), self._reach())
        tell(line)
