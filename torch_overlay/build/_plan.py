"""Decide each patch's state on a set of source texts, with the runtime overlay's rules.

The runtime (``_engine.Overlay._try_apply``) and this module agree on the order: for each variant
(those written for the version first), the reverse diff applying means ``upstream``; otherwise the
first variant whose forward diff applies is used; failing both, ``Applied-Upstream`` <= version
means ``upstream`` and anything else is ``drift``. Patches apply on top of the earlier ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .._engine import _applies_all, _apply_all
from .._patchfile import PatchFile
from .._series import Patch, read_series
from .._versions import parse_version
from . import BuildError

__all__ = ["Plan", "Step", "apply_variant", "load_series", "plan_series", "series_hash"]

APPLY, UPSTREAM, DRIFT = "apply", "upstream", "drift"


@dataclass
class Step:
    patch: Patch
    state: str  # APPLY, UPSTREAM or DRIFT
    reason: str
    variant: PatchFile | None = None  # the variant that applies / reverse-applies

    @property
    def paths(self) -> list[str]:
        return [d.path for d in self.variant.files] if self.variant else []


@dataclass
class Plan:
    version: str
    steps: list[Step]
    before: dict[str, str]  # path -> text as read (missing files absent)
    after: dict[str, str] = field(default_factory=dict)  # with every APPLY step applied, in order

    @property
    def applying(self) -> list[Step]:
        return [s for s in self.steps if s.state == APPLY]

    @property
    def drifted(self) -> list[Step]:
        return [s for s in self.steps if s.state == DRIFT]

    @property
    def changed(self) -> list[str]:
        return [p for p, text in self.after.items() if self.before.get(p) != text]


def load_series(patches_dir: Path) -> list[Patch]:
    """The series, refusing a malformed or empty one (the build forms cannot skip a patch)."""
    patches = read_series(patches_dir)
    bad = [f"{p.id}: {p.error}" for p in patches if p.error]
    if bad:
        raise BuildError("malformed patch in the series:\n  " + "\n  ".join(bad))
    if not patches:
        raise BuildError(f"no patches listed in {patches_dir / 'series'}")
    return patches


def series_hash(patches: Iterable[Patch]) -> str:
    """A short hash of every variant's text, in series order."""
    digest = hashlib.sha256()
    for patch in patches:
        for variant in patch.variants:
            digest.update(variant.text.encode())
    return digest.hexdigest()[:10]


def apply_variant(variant: PatchFile, texts: dict[str, str], reverse: bool = False) -> dict[str, str]:
    """``texts`` (path -> text) with ``variant`` applied; raise ``HunkMismatch``."""
    by_module = {d.module: texts[d.path] for d in variant.files}
    new = _apply_all(variant, by_module, reverse)
    return {**texts, **{d.path: new[d.module] for d in variant.files}}


def _decide(patch: Patch, version: str, texts: dict[str, str]) -> Step:
    forward: PatchFile | None = None
    missing: set[str] = set()
    for variant in patch.ordered_variants(version):
        absent = [d.path for d in variant.files if d.path not in texts]
        if absent:
            missing.update(absent)
            continue
        by_module = {d.module: texts[d.path] for d in variant.files}
        if _applies_all(variant, by_module, reverse=True):
            return Step(patch, UPSTREAM, f"already in the tree ({variant.path.name} reverse-applies)", variant)
        if forward is None and _applies_all(variant, by_module, reverse=False):
            forward = variant
    if forward is not None:
        return Step(patch, APPLY, forward.path.name, forward)
    fixed_in = patch.main.fields.get("Applied-Upstream", "") if patch.main else ""
    if fixed_in and parse_version(version) >= parse_version(fixed_in):
        return Step(patch, UPSTREAM, f"fixed upstream in torch {fixed_in} (by a different change)")
    names = ", ".join(v.path.name for v in patch.variants)
    why = f"{', '.join(sorted(missing))} missing" if missing else "torch changed around the fix"
    return Step(patch, DRIFT, f"no variant fits torch {version} ({names}): {why}")


def plan_series(patches: list[Patch], version: str, read: Callable[[str], str | None]) -> Plan:
    """Walk the series over the texts ``read(path)`` returns (None: no such file)."""
    before: dict[str, str] = {}
    for patch in patches:
        for path in patch.target_paths:
            text = read(path)
            if text is not None:
                before[path] = text
    texts = dict(before)
    steps = []
    for patch in patches:
        step = _decide(patch, version, texts)
        if step.state == APPLY:
            texts = apply_variant(step.variant, texts)
        steps.append(step)
    return Plan(version, steps, before, texts)
