"""``build.sh apply PYTORCH_SRC [--check|--reverse]``: the series on a PyTorch git checkout.

HEAD is the reference: the plan is what the series does to HEAD's files, and the working tree must
be HEAD plus some of those patches (an earlier ``apply``), nothing else. So a second ``apply``
changes nothing, ``--reverse`` restores HEAD's text of the files the series touches, and local
edits are never overwritten.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..series.hunks import HunkMismatch
from . import BuildError
from ._checkout import Checkout, open_checkout
from ..series.plan import PatchState, Plan, Step, apply_variant, load_series, plan_series

__all__ = ["run_apply"]


def _simulate(plan: Plan, subset: list[Step]) -> dict[str, str] | None:
    texts = dict(plan.before)
    for step in plan.applying:
        if step in subset:
            assert step.variant is not None  # an applied step names the variant that applies
            try:
                texts = apply_variant(step.variant, texts)
            except HunkMismatch:
                return None
    return texts


def _present(plan: Plan, work: dict[str, str | None]) -> list[Step]:
    """The patches of ``plan`` already in the working tree; refuse any other local change."""
    applying = plan.applying
    # All, none, a prefix (the series grew since the last apply), or a per-patch guess.
    guess = [s for s in applying if _reverse_applies(s, work)]
    candidates = [applying, [], *(applying[:n] for n in range(len(applying) - 1, 0, -1)), guess]
    for subset in candidates:
        if _simulate(plan, subset) == work:
            return subset
    changed = [p for p, text in work.items() if text not in (plan.before[p], plan.after[p])]
    raise BuildError(
        "the checkout has local changes in files the series touches: "
        + ", ".join(changed or sorted(work))
        + "\ncommit or stash them (or `git checkout -- FILE`) first; nothing was changed"
    )


def _reverse_applies(step: Step, work: dict[str, str | None]) -> bool:
    texts = {p: work[p] for p in step.paths}
    if any(t is None for t in texts.values()):
        return False
    try:
        apply_variant(step.variant, texts, reverse=True)  # type: ignore[arg-type]
    except HunkMismatch:
        return False
    return True


def _report(out: TextIO, rows: list[tuple[str, Step, str]]) -> None:
    width = max(len(state) for state, _, _ in rows)
    for state, step, reason in rows:
        out.write(f"  {state.ljust(width)}  {step.patch.id}  ({reason})\n")


def _refuse_dirty(checkout: Checkout, touched: set[str]) -> None:
    foreign = sorted(set(checkout.changed_paths()) - touched)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise BuildError(
            f"the checkout {checkout.root} has uncommitted changes ({shown});"
            " commit or stash them first; nothing was changed"
        )


def run_apply(
    src: Path | str, patches_dir: Path, *, check: bool = False, reverse: bool = False, out: TextIO | None = None
) -> int:
    """Apply (or with ``reverse`` undo) the series on ``src``; with ``check`` only report. Exit status."""
    out = out or sys.stdout
    checkout = open_checkout(src)
    patches = load_series(patches_dir)
    touched = {p for patch in patches for p in (t.path for t in patch.targets)}
    for path in sorted(touched):
        checkout.path(path, "diff path")
    _refuse_dirty(checkout, touched)
    plan = plan_series(patches, checkout.version, checkout.head_text)
    work = {p: checkout.work_text(p) for p in plan.before}
    present = _present(plan, work)

    verb = "check" + (" --reverse" if reverse else "") if check else ("reverse" if reverse else "apply")
    out.write(
        f"{verb}: {len(patches)} patch(es) from {patches_dir} on {checkout.root} (version.txt {checkout.version})\n"
    )
    rows: list[tuple[str, Step, str]] = []
    for step in plan.steps:
        if step.state == PatchState.UPSTREAM:
            rows.append(
                ("upstream", step, step.reason if not reverse else f"part of this PyTorch, left alone: {step.reason}")
            )
        elif step.state == PatchState.NOT_NEEDED:
            rows.append(("not needed", step, step.reason))
        elif step.state == PatchState.DRIFT:
            rows.append(("drift", step, step.reason))
        elif step.variant is None:  # what is left applies (a source tree has no "source only")
            raise AssertionError(f"{step.patch.id}: {step.state} without a variant")
        elif step in present and not reverse:
            rows.append(("upstream", step, f"already applied to the working tree ({step.variant.path.name})"))
        elif step in present:
            rows.append(("would revert" if check else "reverted", step, step.variant.path.name))
        elif reverse:
            rows.append(("not applied", step, step.variant.path.name))
        else:
            rows.append(
                ("would apply" if check else "applied", step, f"{step.variant.path.name}: {', '.join(step.paths)}")
            )

    if plan.drifted and not reverse:
        _report(out, rows)
        raise BuildError(
            f"{len(plan.drifted)} patch(es) do not fit this checkout (drift): "
            + ", ".join(s.patch.id for s in plan.drifted)
            + "; nothing was changed"
        )
    # Undoing the patches found in the tree gives HEAD's text back: _present proved
    # that the working tree is exactly HEAD plus those patches.
    target = plan.before if reverse else plan.after
    changes = {p: text for p, text in target.items() if work[p] != text}
    if not check:
        checkout.write(changes)
    _report(out, rows)
    done = "would change" if check else "changed"
    out.write(f"{done} {len(changes)} file(s){': ' + ', '.join(sorted(changes)) if changes else ''}\n")
    return 0
