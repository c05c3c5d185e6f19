"""One rule, shared by the runtime overlay and the source-build tools: what a patch does to a tree.

A torch older than ``Introduced`` does not have the bug (``not needed``). Otherwise, for each
variant (those written for the installed version first): if its reverse diff applies,
the tree already has it (``upstream``); otherwise the first variant whose forward diff applies is
used (``applied``). Failing both, a torch at or past ``Applied-Upstream`` has the fix by another
change (``upstream``); anything else is ``drift``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._hunks import apply_file_diff, HunkMismatch
from ._patchfile import PatchFile
from ._series import Patch
from ._state import PatchState
from ._versions import parse_version

__all__ = ["apply_variant", "decide", "Decision"]


@dataclass
class Decision:
    state: PatchState  # APPLIED (the diff applies), UPSTREAM or DRIFT
    reason: str
    variant: PatchFile | None = None  # the variant that applies or reverse-applies
    texts: dict[str, str] = field(default_factory=dict)  # APPLIED: path -> patched text


def apply_variant(variant: PatchFile, texts: dict[str, str], reverse: bool = False) -> dict[str, str]:
    """``texts`` (path -> text) with every file of ``variant`` applied; raise ``HunkMismatch``."""
    out = dict(texts)
    for diff in variant.files:
        out[diff.path] = apply_file_diff(out[diff.path], diff, reverse)
    return out


def decide(patch: Patch, version: str, texts: dict[str, str]) -> Decision:
    """What ``patch`` does to ``texts`` (path -> current text) on torch ``version``."""
    introduced = patch.main.fields.get("Introduced", "") if patch.main else ""
    if introduced and parse_version(version) < parse_version(introduced):
        return Decision(PatchState.NOT_NEEDED, f"the bug came with torch {introduced}; torch {version} does not have it")
    forward: Decision | None = None
    missing: set[str] = set()
    for variant in patch.ordered_variants(version):
        absent = [d.path for d in variant.files if d.path not in texts]
        if absent:
            missing.update(absent)
            continue
        try:
            apply_variant(variant, texts, reverse=True)
            return Decision(PatchState.UPSTREAM, f"torch {version} already has this change ({variant.path.name} reverse-applies)", variant)
        except HunkMismatch:
            pass
        if forward is None:
            try:
                forward = Decision(PatchState.APPLIED, variant.path.name, variant, apply_variant(variant, texts))
            except HunkMismatch:
                pass
    if forward is not None:
        return forward
    fixed_in = patch.main.fields.get("Applied-Upstream", "") if patch.main else ""
    if fixed_in and parse_version(version) >= parse_version(fixed_in):
        return Decision(PatchState.UPSTREAM, f"fixed upstream in torch {fixed_in} (by a different change); not needed")
    names = ", ".join(v.path.name for v in patch.variants)
    why = f"{', '.join(sorted(missing))} missing" if missing else "torch changed around the fix"
    return Decision(PatchState.DRIFT, f"no variant fits torch {version} ({names}): {why}")
