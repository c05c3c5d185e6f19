"""The words every part of the overlay uses for what a patch does: its state, its targets, its row."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Mode", "OverlayError", "OverlayWarning", "PatchState", "PatchStatus", "Target"]


class OverlayError(RuntimeError):
    """Raised instead of a warning under ``TORCH_OVERLAY_STRICT=1``."""


class OverlayWarning(UserWarning):
    """A patch drifted or failed, or a switch or the series could not be read."""


class PatchState(enum.StrEnum):
    APPLIED = "applied"  # the patched code is live (the build tools: the diff applies)
    UPSTREAM = "upstream"  # torch already has the change
    DRIFT = "drift"  # neither the diff nor its reverse fits
    NOT_NEEDED = "not needed"  # the bug came later than this release (before `Introduced`)
    DISABLED = "disabled"  # switched off (or reverted)
    PENDING = "pending"  # waiting for its modules to be imported
    SOURCE_ONLY = "source only"  # the fix is in compiled sources (C++): a source build carries it
    FAILED = "failed"  # anything unexpected; the reason says what


class Mode(enum.StrEnum):
    """How an applied patch reached its modules."""

    AT_IMPORT = "at import"  # the module executed the patched source
    SWAPPED = "swapped"  # the module was imported first; changed functions got the patched code
    MIXED = "at import, swapped"


@dataclass(frozen=True)
class Target:
    """A file a patch changes: its path in torch's tree and the module it defines."""

    path: str  # "torch/distributed/tensor/_api.py"
    module: str  # "torch.distributed.tensor._api" ("" for a compiled source: "torch/csrc/...cpp")

    @classmethod
    def from_path(cls, path: str) -> Target:
        if not path.endswith(".py"):
            return cls(path, "")
        parts = path.removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts.pop()
        return cls(path, ".".join(parts))


@dataclass
class PatchStatus:
    id: str
    title: str
    bug: str
    targets: tuple[Target, ...]
    state: PatchState
    reason: str
    variant: str = ""  # file name of the variant that applied / matched
    mode: str = ""  # a Mode when applied

    def as_dict(self) -> dict[str, object]:
        out = dict(self.__dict__)
        out["targets"] = [t.path for t in self.targets]
        out["state"] = str(self.state)
        return out
