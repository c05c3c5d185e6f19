"""What the launcher adds to each process beyond ``import torch_overlay``."""

from __future__ import annotations

__all__ = ["install"]


def install() -> None:
    """``TORCH_OVERLAY_CHECK_RANKS`` (warn or fail) hooks process-group setup; nothing else yet."""
    from ..engine.overlay import process_overlay

    if process_overlay().config.check_ranks != "off":
        from ..checks.ranks_hook import install as install_check

        install_check()
