"""One rule, shared by the runtime overlay and the source-build tools: what a patch does to a tree.

The header decides first, without reading a file: a torch older than ``Introduced`` does not have
the bug (``not needed``); a released torch at or past ``Applied-Upstream`` has the fix
(``upstream``). Otherwise, for each variant written for this torch (``Torch-Versions``; a variant
without it fits any): if its reverse diff applies, the tree already has it (``upstream``); otherwise
the first variant whose forward diff applies is used (``applied``). Failing both, a pre-release at
or past ``Applied-Upstream`` has the fix by another change (``upstream``); anything else: ``drift``.

Patches that change the same lines are a stack: in a tree that carries the whole series (a rebuilt
wheel, an applied checkout) an earlier patch's reverse diff applies only once the later ones are
taken off. :func:`carried_stack` walks the series from its end to find them.

A variant may change C++ sources (``torch/csrc/...``) as well as Python files. A source checkout
takes every hunk. The runtime overlay and a rebuilt wheel (``python_only``) only have the Python
files: they decide on those, and a patch whose fitting variants change no Python file is
``source only``, which says that a source build carries it.
"""

from __future__ import annotations

import re

from .diff_header import PatchParseError
from .patchfile import PatchFile
from .series import Patch
from .._state import PatchState
from .versions import parse_version, version_in

__all__ = ["apply_variant", "carried_stack", "decide", "decide_by_header", "Decision", "fitting_variants"]

_PRE_RELEASE = re.compile(r"^\s*\d+(\.\d+)*\.?(a|b|rc|dev|alpha|beta)", re.I)


class Decision:
    """What a patch does to a tree: its state, why, and the variant (a plain class: it is imported
    by ``import torch_overlay``, where making a dataclass costs about 2 M instructions)."""

    __slots__ = ("state", "reason", "variant", "texts")

    def __init__(
        self, state: PatchState, reason: str, variant: PatchFile | None = None, texts: dict[str, str] | None = None
    ) -> None:
        self.state = state  # APPLIED (the diff applies), UPSTREAM or DRIFT
        self.reason = reason
        self.variant = variant  # the variant that applies or reverse-applies
        self.texts: dict[str, str] = {} if texts is None else texts  # APPLIED: path -> patched text

    def __repr__(self) -> str:
        return f"Decision({self.state!r}, {self.reason!r}, {self.variant!r})"


def apply_variant(
    variant: PatchFile, texts: dict[str, str], reverse: bool = False, *, python_only: bool = False
) -> dict[str, str]:
    """``texts`` (path -> text) with every file of ``variant`` applied (with ``python_only``, its
    Python files); raise ``HunkMismatch``."""
    from .hunks import apply_file_diff  # here: `import torch_overlay` decides most patches without it

    out = dict(texts)
    for diff in variant.files:
        if not python_only or diff.path.endswith(".py"):
            out[diff.path] = apply_file_diff(out[diff.path], diff, reverse)
    return out


# What reverse-applying a variant gave, by the variant and the texts it was tried on: shared by
# :func:`carried_stack` and :func:`decide` over one tree, so that each is tried once.
Tried = dict[tuple[object, ...], "dict[str, str] | None"]


def _taken_off(
    variant: PatchFile, texts: dict[str, str], python_only: bool, tried: Tried | None
) -> dict[str, str] | None:
    """The texts of the files ``variant`` changes with its reverse diff applied, or None when it
    does not reverse-apply; raise ``PatchParseError`` for a malformed variant."""
    from .hunks import HunkMismatch

    paths = variant.python_paths if python_only else variant.paths
    key = (variant, python_only, *(texts[p] for p in paths))
    if tried is not None and key in tried:
        return tried[key]
    try:
        out: dict[str, str] | None = apply_variant(
            variant, {p: texts[p] for p in paths}, reverse=True, python_only=python_only
        )
    except HunkMismatch:
        out = None
    if tried is not None:
        tried[key] = out
    return out


def decide_by_header(patch: Patch, version: str) -> Decision | None:
    """The decision the patch's fields give for torch ``version`` alone, or None: read the files."""
    main = patch.main
    if main is None:
        return None
    introduced = main.field("Introduced")
    if introduced and parse_version(version) < parse_version(introduced):
        return Decision(
            PatchState.NOT_NEEDED, f"the bug came with torch {introduced}; torch {version} does not have it"
        )
    fixed_in = main.field("Applied-Upstream")
    # A pre-release ("2.13.0a0", a source checkout of main) may predate the fix: its files decide.
    if fixed_in and not _PRE_RELEASE.search(version) and parse_version(version) >= parse_version(fixed_in):
        return Decision(PatchState.UPSTREAM, f"fixed upstream in torch {fixed_in}")
    return None


def fitting_variants(patch: Patch, version: str) -> list[PatchFile]:
    """The variants written for torch ``version`` (those without ``Torch-Versions`` fit any), in order."""
    return [v for v in patch.ordered_variants(version) if version_in(version, v.field("Torch-Versions"))]


def decide(
    patch: Patch, version: str, texts: dict[str, str], *, python_only: bool = False, tried: Tried | None = None
) -> Decision:
    """What ``patch`` does to ``texts`` (path -> current text) on torch ``version``; with
    ``python_only``, what it does to the Python files (an installed torch: the runtime, a wheel).
    ``tried``: the reverse diffs :func:`carried_stack` already tried on this tree."""
    by_header = decide_by_header(patch, version)
    if by_header is not None:
        return by_header
    from .hunks import HunkMismatch

    variants = fitting_variants(patch, version)
    if python_only and variants and not any(v.python_paths for v in variants):
        compiled = ", ".join(dict.fromkeys(p for v in variants for p in v.paths))
        return Decision(
            PatchState.SOURCE_ONLY,
            f"the fix is in compiled sources ({compiled}): a source build carries it (./build.sh apply PYTORCH_SRC)",
        )
    forward: Decision | None = None
    missing: set[str] = set()
    for variant in variants:
        paths = variant.python_paths if python_only else variant.paths
        absent = [p for p in paths if p not in texts]
        if absent or not paths:
            missing.update(absent)
            continue
        if _taken_off(variant, texts, python_only, tried) is not None:
            return Decision(
                PatchState.UPSTREAM,
                f"torch {version} already has this change ({variant.name} reverse-applies)",
                variant,
            )
        if forward is None:
            try:
                name = variant.name
                if python_only and len(paths) < len(variant.paths):
                    name += " (its C++ hunks need a source build)"
                forward = Decision(
                    PatchState.APPLIED, name, variant, apply_variant(variant, texts, python_only=python_only)
                )
            except HunkMismatch:
                pass
    if forward is not None:
        return forward
    # A pre-release past Applied-Upstream whose files fit no variant has the fix by another change.
    fixed_in = patch.main.field("Applied-Upstream") if patch.main else ""
    if fixed_in and parse_version(version) >= parse_version(fixed_in):
        return Decision(PatchState.UPSTREAM, f"fixed upstream in torch {fixed_in} (by a different change); not needed")
    if not variants:
        names = ", ".join(f"{v.name} ({v.field('Torch-Versions')})" for v in patch.variants)
        return Decision(PatchState.DRIFT, f"no variant is written for torch {version}: {names}")
    names = ", ".join(v.name for v in variants)
    why = f"{', '.join(sorted(missing))} missing" if missing else "torch changed around the fix"
    return Decision(PatchState.DRIFT, f"no variant fits torch {version} ({names}): {why}")


def carried_stack(
    patches: list[Patch], version: str, texts: dict[str, str], *, python_only: bool = False, tried: Tried | None = None
) -> dict[str, Decision]:
    """By patch id, the ``upstream`` decision of each patch ``texts`` already carry as a stack.

    From the last patch to the first, a patch whose reverse diff applies to the texts with the
    later carried patches taken off is carried. Patches the header decides are left out. Pass the
    same ``tried`` to :func:`decide` over these texts: a reverse diff tried here on the texts it
    then sees (a file no earlier patch changes) is not tried again.
    """
    carried: dict[str, Decision] = {}
    current = dict(texts)
    for patch in reversed(patches):
        if decide_by_header(patch, version) is not None:
            continue
        for variant in fitting_variants(patch, version):
            paths = variant.python_paths if python_only else variant.paths
            if not paths or any(p not in current for p in paths):
                continue
            try:
                taken = _taken_off(variant, current, python_only, tried)
            except PatchParseError:  # a malformed patch fails its own decision
                continue
            if taken is None:
                continue
            current = {**current, **taken}
            reason = f"torch {version} already has this change ({variant.name} reverse-applies)"
            carried[patch.id] = Decision(PatchState.UPSTREAM, reason, variant)
            break
    return carried
