"""Walk the series over a tree's source texts with the runtime overlay's rule (:mod:`.decide`).

Patches apply on top of the earlier ones, as at run time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .decide import apply_variant, carried_stack, decide, Tried
from .patchfile import PatchFile
from .series import Patch, read_series, SeriesError
from .._state import PatchState

__all__ = ["Plan", "PatchState", "Step", "apply_variant", "load_series", "plan_series", "series_hash"]


@dataclass
class Step:
    patch: Patch
    state: PatchState  # APPLIED (the diff applies), UPSTREAM or DRIFT
    reason: str
    variant: PatchFile | None = None  # the variant that applies / reverse-applies

    @property
    def paths(self) -> list[str]:
        return list(self.variant.paths) if self.variant else []


@dataclass
class Plan:
    version: str
    steps: list[Step]
    before: dict[str, str]  # path -> text as read (missing files absent)
    after: dict[str, str] = field(default_factory=dict)  # with every applied step, in order

    @property
    def applying(self) -> list[Step]:
        return [s for s in self.steps if s.state == PatchState.APPLIED]

    @property
    def drifted(self) -> list[Step]:
        return [s for s in self.steps if s.state == PatchState.DRIFT]

    @property
    def changed(self) -> list[str]:
        return [p for p, text in self.after.items() if self.before.get(p) != text]


def load_series(patches_dir: Path) -> list[Patch]:
    """The series, refusing a malformed or empty one with ``SeriesError`` (the build forms cannot
    skip a patch, as the runtime overlay does)."""
    patches = read_series(patches_dir)
    bad = [f"{p.id}: {p.error}" for p in patches if p.error]
    if bad:
        raise SeriesError("malformed patch in the series:\n  " + "\n  ".join(bad))
    return patches


def series_hash(patches: Iterable[Patch]) -> str:
    """A short hash of every variant's text, in series order."""
    digest = hashlib.sha256()
    for patch in patches:
        for variant in patch.variants:
            digest.update(variant.text.encode())
    return digest.hexdigest()[:10]


def _decide(patch: Patch, version: str, texts: dict[str, str], python_only: bool, tried: Tried) -> Step:
    decision = decide(patch, version, texts, python_only=python_only, tried=tried)
    return Step(patch, decision.state, decision.reason, decision.variant)


def plan_series(
    patches: list[Patch], version: str, read: Callable[[str], str | None], *, python_only: bool = False
) -> Plan:
    """Walk the series over the texts ``read(path)`` returns (None: no such file); with
    ``python_only`` (an installed torch), over its Python files alone."""
    before: dict[str, str] = {}
    for patch in patches:
        for path in (t.path for t in patch.targets):
            text = read(path) if path.endswith(".py") or not python_only else None
            if text is not None:
                before[path] = text
    texts = dict(before)
    steps = []
    tried: Tried = {}  # each reverse diff is tried once, by carried_stack or decide
    carried = carried_stack(patches, version, before, python_only=python_only, tried=tried)
    for patch in patches:
        if patch.id in carried:
            decision = carried[patch.id]
            steps.append(Step(patch, decision.state, decision.reason, decision.variant))
            continue
        step = _decide(patch, version, texts, python_only, tried)
        if step.state == PatchState.APPLIED:
            assert step.variant is not None  # an applied step names the variant that applies
            texts = apply_variant(step.variant, texts, python_only=python_only)
        steps.append(step)
    return Plan(version, steps, before, texts)
