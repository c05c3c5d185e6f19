"""torch_overlay: fixes for PyTorch internals, applied to the installed torch as it is imported.

``import torch_overlay`` (before or after ``import torch``) reads ``patches/series`` and applies
each patch the installed torch needs when the module it changes is first imported. Nothing heavy is
imported here. See ``python -m torch_overlay status``.
"""

from __future__ import annotations

from typing import Any

from ._engine import Overlay, OverlayError, PatchStatus

__all__ = [
    "OverlayError",
    "PatchStatus",
    "RanksReport",
    "ReplicaDivergenceError",
    "ReplicaDivergenceWarning",
    "ReplicaMismatch",
    "ReplicaReport",
    "check_ranks",
    "check_replicas",
    "guard_replicas",
    "revert",
    "status",
]

_overlay = Overlay()
_overlay.activate()


def status() -> list[PatchStatus]:
    """Each patch's state in this process: applied, upstream, drift, disabled, pending or failed."""
    return _overlay.status()


def revert() -> None:
    """Restore torch's original code for every applied patch; nothing is applied afterwards."""
    _overlay.revert()


_LAZY = {
    "check_replicas": "torch_overlay.replicas",
    "guard_replicas": "torch_overlay.replicas",
    "ReplicaReport": "torch_overlay.replicas",
    "ReplicaDivergenceError": "torch_overlay.replicas",
    "ReplicaDivergenceWarning": "torch_overlay.replicas",
    "ReplicaMismatch": "torch_overlay.replicas",
    "check_ranks": "torch_overlay.ranks",
    "RanksReport": "torch_overlay.ranks",
}


def __getattr__(name: str) -> Any:
    # The replica checker imports torch.distributed; keep `import torch_overlay` light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torch_overlay' has no attribute {name!r}")
