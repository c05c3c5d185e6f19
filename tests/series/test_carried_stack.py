"""A tree that carries the whole series (a rebuilt wheel, an applied checkout) reads as ``upstream``
for every patch it needs, also where two patches change the same lines (a stack: the earlier one's
reverse diff applies only once the later one is taken off)."""

from __future__ import annotations

from pathlib import Path

import torch

from torch_overlay._state import PatchState
from torch_overlay.series.plan import load_series, plan_series

REPO = Path(__file__).resolve().parents[2]
TORCH_ROOT = Path(torch.__file__).resolve().parent.parent
VERSION = torch.__version__.split("+")[0]


def _read(path: str) -> str | None:
    file = TORCH_ROOT / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def test_the_installed_torch_with_the_series_applied_carries_every_applied_patch() -> None:
    patches = load_series(REPO / "patches")
    first = plan_series(patches, VERSION, _read, python_only=True)
    applied = {s.patch.id for s in first.applying}
    assert applied, f"no patch applies to torch {VERSION}: nothing to check"

    again = plan_series(patches, VERSION, lambda p: first.after.get(p, _read(p)), python_only=True)
    states = {s.patch.id: s.state for s in again.steps if s.patch.id in applied}
    assert states == dict.fromkeys(applied, PatchState.UPSTREAM)
    assert again.changed == []


def test_a_stack_of_two_patches_on_one_file_peels_from_the_top() -> None:
    patches = {p.id: p for p in load_series(REPO / "patches")}
    stack = [patches["dsd-init-optim-state-grad-dtype"], patches["dsd-optim-state-params-without-grad"]]
    first = plan_series(stack, VERSION, _read, python_only=True)
    if [s.state for s in first.steps] != [PatchState.APPLIED, PatchState.APPLIED]:
        return  # torch has (part of) it: the stack is checked where both apply
    again = plan_series(stack, VERSION, lambda p: first.after.get(p, _read(p)), python_only=True)
    assert [s.state for s in again.steps] == [PatchState.UPSTREAM, PatchState.UPSTREAM]
