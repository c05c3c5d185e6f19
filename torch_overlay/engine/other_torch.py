"""A torch other than the one the overlay was set up for, imported after ``sys.path`` changed.

The series was settled for the torch that ``import torch_overlay`` found (its version, its files).
A ``usercustomize`` or the script itself may then put another torch first on ``sys.path``: its
modules run their own code, and the overlay says so instead of deciding for the wrong files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._state import OverlayError, PatchState
from ..series.versions import torch_moved

if TYPE_CHECKING:
    from typing import Protocol

    from .._config import Config
    from .components import Entry

    class Overlay(Protocol):  # what of the overlay this needs (its module imports this one)
        config: Config
        problems: list[str]

        def report_problem(self, message: str) -> None: ...


__all__ = ["left_to_another_torch"]


def left_to_another_torch(entries: list[Entry], overlay: Overlay) -> bool:
    """Whether the torch imported is not the one ``overlay`` was set up for: then ``entries`` fail,
    the overlay says why once, and strict mode raises at every import of their modules."""
    moved = torch_moved()
    if moved is None:
        return False
    for entry in entries:
        entry.state, entry.reason = PatchState.FAILED, moved
    if moved not in overlay.problems:
        overlay.report_problem(moved)  # raises under strict
    elif overlay.config.strict:
        raise OverlayError(f"torch_overlay: {moved}")
    return True
