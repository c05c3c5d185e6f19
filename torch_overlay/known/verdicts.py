"""Which known bug each error of a log is, and what that means for a torch release.

For a fix of the series the answer comes from its fields first, as ``status`` decides without
reading torch files: *fixed by <id>* on a torch it applies to, *fixed upstream in X* past
``Applied-Upstream``, *not this bug* before ``Introduced``. For the installed torch (no
``--torch``) the series is also walked over its files, so a fix that drifted says so, and the
environment's switches (``TORCH_OVERLAY=0``, ``TORCH_OVERLAY_DISABLE``) are read. A log that
carries the overlay's own warning for a fix (drift, failed, imported too late) says that the fix
was not active in that job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._state import PatchState
from ..series.decide import decide_by_header, fitting_variants
from ..series.versions import parse_version, SUPPORTED, version_in
from .catalogue import Catalogue, KnownBug
from .logparse import find_errors, LoggedError, message_only
from .signatures import KNOWN, POSSIBLY
from .subsystems import pointed_at

__all__ = ["Explanation", "Match", "broken_on", "explain_log"]

# What a fix means for a torch release ("verdict" in --json).
APPLIES = "fixed-by-overlay"  # the overlay applies it on this torch
NOT_ACTIVE = "fix-not-active"  # it would, but is disabled, drifted or failed
UPSTREAM = "fixed-upstream"  # this torch has the fix
NOT_NEEDED = "not-this-bug"  # this torch predates the bug
NO_VARIANT = "no-fix-for-this-torch"
NOT_FIXED = "known-not-fixed"  # a looked-at report
UNKNOWN_TORCH = "torch-unknown"

_OVERLAY_WARNING = re.compile(r"torch_overlay: patch (\S+) (drift|failed): (.*?); torch is left unpatched")
# The line the overlay prints after a traceback whose fix was not active (known/hint.py).
_OVERLAY_HINT = re.compile(
    r"torch_overlay: this error is a known torch bug \([^)]*\) that (\S+) fixes, but that fix is (\w[\w ]*?) in this process: (.*?)$",
    re.M,
)
_RELEASES = ("2.11", "2.12", "2.13", "2.14", "2.15")


@dataclass
class Match:
    bug: KnownBug
    verdict: str
    advice: str
    confidence: str = KNOWN  # POSSIBLY: the text matches, a qualifier (frame, type) is not in the paste

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.bug.id,
            "confidence": self.confidence,
            "kind": self.bug.kind,
            "title": self.bug.title,
            "links": list(self.bug.links),
            "broken_on": broken_on(self.bug),
            "verdict": self.verdict,
            "advice": self.advice,
        }


@dataclass
class Explanation:
    error: LoggedError
    matches: list[Match]

    @property
    def known(self) -> bool:
        return bool(self.matches)

    def as_dict(self) -> dict[str, object]:
        return {
            "error": self.error.headline,
            "type": self.error.type,
            "ranks": self.error.ranks,
            "known": self.known,
            "matches": [m.as_dict() for m in self.matches],
        }


def _family(version: str) -> str:
    major, minor, _ = parse_version(version)
    return f"{major}.{minor}"


def broken_on(bug: KnownBug) -> str:
    """The releases with the bug, as measured: ``2.11 – 2.15 (unfixed upstream)``."""
    if bug.kind == "looked-at":
        versions = bug.entry.get("versions", {})
        bad = [v for v, outcome in versions.items() if not str(outcome).startswith(("ok", "not reproduced", "passes"))]
        text = _span([_family(v) for v in bad]) if bad else "not reproduced on a supported torch"
        fixed = bug.entry.get("fixed_upstream")
        return f"{text} (fixed upstream in {fixed})" if fixed else text
    assert bug.patch is not None and bug.patch.main is not None  # a fix is made from its patch's main file
    fields = bug.patch.main.fields
    families = [_family(v) for v in fields.get("Affects", "").split(",") if v.strip()]
    fixed = fields.get("Applied-Upstream", "")
    upstream = f"fixed upstream in {fixed}" if fixed else "unfixed upstream"
    return f"{_span(families)} ({upstream})"


def _span(families: list[str]) -> str:
    unique = sorted(set(families), key=parse_version)
    if len(unique) > 2 and all(f in _RELEASES for f in unique):
        first, last = _RELEASES.index(unique[0]), _RELEASES.index(unique[-1])
        if list(_RELEASES[first : last + 1]) == unique:
            return f"{unique[0]} – {unique[-1]}"
    return ", ".join(unique) or "not measured"


def _fix_match(
    bug: KnownBug,
    torch: str | None,
    installed: bool,
    env: Mapping[str, str],
    job_warnings: dict[str, str],
    drifted: Callable[[str], str | None],
) -> Match:
    patch = bug.patch
    assert patch is not None and patch.main is not None  # a fix is made from its patch's main file
    fixed = patch.main.fields.get("Applied-Upstream", "")
    if torch is None:
        return Match(
            bug,
            UNKNOWN_TORCH,
            f"fixed by {bug.id} on the torch releases it is broken on; no torch is installed here: pass --torch VERSION for your release",
        )
    decision = decide_by_header(patch, torch)
    if decision is not None and decision.state == PatchState.NOT_NEEDED:
        return Match(
            bug,
            NOT_NEEDED,
            f"torch {torch} predates this bug ({decision.reason}): on this torch the error has another cause",
        )
    if decision is not None and decision.state == PatchState.UPSTREAM:
        return Match(
            bug,
            UPSTREAM,
            f"fixed upstream in torch {fixed}: torch {torch} has the fix, so on it this error has another cause (or the fix is incomplete: report it)",
        )
    if not version_in(torch, ",".join(SUPPORTED)):
        return Match(
            bug,
            NO_VARIANT,
            f"the series is written for torch {' and '.join(SUPPORTED)}, not {torch}: the overlay cannot fix {bug.id} there",
        )
    if not fitting_variants(patch, torch):
        return Match(
            bug,
            NO_VARIANT,
            f"the series has no variant of {bug.id} written for torch {torch}: the overlay cannot fix it there",
        )
    also = f"; also fixed upstream in torch {fixed}: upgrading fixes it without the overlay" if fixed else ""
    if bug.id in job_warnings:
        return Match(
            bug, NOT_ACTIVE, f"fixed by {bug.id}, but it was not active in this job ({job_warnings[bug.id]}){also}"
        )
    if installed:
        switch = _switched_off(bug.id, env)
        if switch:
            return Match(bug, NOT_ACTIVE, f"fixed by {bug.id}, but not active here: {switch}{also}")
        why = drifted(bug.id)
        if why:
            return Match(
                bug,
                NOT_ACTIVE,
                f"fixed by {bug.id}, but it does not apply to the installed torch {torch} (drift: {why}): report it{also}",
            )
    return Match(
        bug,
        APPLIES,
        f"fixed by {bug.id}, which the overlay applies on torch {torch}: `import torch_overlay` before torch's "
        f"internals in every process, or start the job with `torch-overlay-run`; if the job did, "
        f"`python -m torch_overlay status` says why the fix was not active{also}",
    )


def _switched_off(pid: str, env: Mapping[str, str]) -> str | None:
    from .._config import parse_switch

    enabled, _ = parse_switch("TORCH_OVERLAY", env.get("TORCH_OVERLAY"), True)
    if not enabled:
        return f"TORCH_OVERLAY={env.get('TORCH_OVERLAY')} turns the overlay off (unset it)"
    disabled = {item.strip() for item in env.get("TORCH_OVERLAY_DISABLE", "").split(",")}
    if pid in disabled:
        return f"TORCH_OVERLAY_DISABLE names it (remove {pid} from it)"
    return None


def _looked_at_match(bug: KnownBug, torch: str | None) -> Match:
    entry = bug.entry
    fixed = entry.get("fixed_upstream")
    if torch and fixed and parse_version(torch) >= parse_version(fixed):
        return Match(
            bug,
            UPSTREAM,
            f"fixed upstream in torch {fixed}: torch {torch} has the fix, so on it this error has another cause",
        )
    advice = f"known, not fixed by this series: {entry['verdict']}"
    if entry.get("workaround"):
        advice += f". Workaround: {entry['workaround']}"
    return Match(bug, NOT_FIXED, advice)


def explain_log(
    text: str,
    catalogue: Catalogue,
    torch: str | None,
    *,
    installed: bool = False,
    env: Mapping[str, str] | None = None,
    drifted: Callable[[str], str | None] = lambda pid: None,
) -> list[Explanation]:
    """One :class:`Explanation` per distinct error of ``text``, for torch release ``torch``
    (``installed``: the torch of this environment, whose switches ``env`` holds)."""
    env = os.environ if env is None else env
    job_warnings = {m.group(1): f"{m.group(2)}, {m.group(3)}" for m in _OVERLAY_WARNING.finditer(text)}
    for m in _OVERLAY_HINT.finditer(text):
        job_warnings.setdefault(m.group(1), f"{m.group(2)}: {m.group(3)}")
    errors = find_errors(text)
    if not errors:  # a message quoted without its exception class
        errors = [e for e in [message_only(text)] if e is not None]
        errors = [e for e in errors if _any_match(e, catalogue)]
    parts = pointed_at(text)  # the paste's frames, messages and words around them
    out = []
    for error in errors:
        matched = error.as_error_text()
        named = pointed_at(matched.text)  # the parts of torch the message itself names
        matches = []
        for bug in catalogue.bugs:
            found = [sig.match(matched) for sig in bug.signatures]
            if not any(found):
                continue
            confidence = KNOWN if KNOWN in found else POSSIBLY
            if confidence == POSSIBLY and not _points_at(bug, named, parts):
                continue
            if bug.kind == "fix":
                match = _fix_match(bug, torch, installed, env, job_warnings, drifted)
            else:
                match = _looked_at_match(bug, torch)
            match.confidence = confidence
            matches.append(match)
        # A sure answer outranks a guess: "possibly" is given only where nothing is known.
        if any(m.confidence == KNOWN for m in matches):
            matches = [m for m in matches if m.confidence == KNOWN]
        out.append(Explanation(error, matches))
    return out


def _points_at(bug: KnownBug, named: frozenset[str], parts: frozenset[str]) -> bool:
    """Whether a guess at ``bug`` is worth giving: the text points at the parts of torch with the
    bug that its message does not name already (a message of torch.utils.checkpoint is a bug of
    checkpointing *under compile* only where the text speaks of compile)."""
    unnamed = bug.parts - named
    return not unnamed or bool(unnamed & parts)


def _any_match(error: LoggedError, catalogue: Catalogue) -> bool:
    text = error.as_error_text()
    return any(sig.match(text) for bug in catalogue.bugs for sig in bug.signatures)
