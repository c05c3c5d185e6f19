"""What the launcher adds to each process beyond ``import torch_overlay``."""

from __future__ import annotations

import os

__all__ = ["install"]


def install() -> None:
    """Nothing yet beyond the import; ``TORCH_OVERLAY_CHECK_RANKS`` hooks process-group setup."""
    if os.environ.get("TORCH_OVERLAY_CHECK_RANKS", "").strip().lower() in ("1", "true", "yes", "on"):
        from ..checks.ranks_hook import install as install_check

        install_check()
