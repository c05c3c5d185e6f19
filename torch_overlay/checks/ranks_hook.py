"""``torch-overlay-run --check-ranks[=warn|fail]`` (``TORCH_OVERLAY_CHECK_RANKS``): compare the ranks once.

Right after ``init_process_group`` returns, every rank runs :func:`torch_overlay.check_ranks` (one
small all-gather); the report is the same on every rank, so rank 0 alone says it, every line
prefixed ``torch_overlay:``. Ranks that agree: one INFO line. Ranks that differ: a warning (``warn``),
or :class:`torch_overlay.OverlayError` raised on every rank (``fail``, or ``TORCH_OVERLAY_STRICT=1``),
which stops the job; raising on every rank, not only on rank 0, leaves no rank waiting in a collective.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ..engine.overlay import process_overlay

__all__ = ["install"]

C10D = "torch.distributed.distributed_c10d"
log = logging.getLogger("torch_overlay")


def _prefixed(text: str) -> str:
    return "\n".join(f"torch_overlay: {line}" for line in text.splitlines())


def _wrap(module: Any) -> None:
    original = module.init_process_group
    if getattr(original, "_torch_overlay_checks_ranks", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        import torch_overlay

        report = torch_overlay.check_ranks()
        config = process_overlay().config
        if not report.ok and (config.check_ranks == "fail" or config.strict):
            raise torch_overlay.OverlayError(_prefixed(str(report)))
        if module.get_rank() == 0:
            log.log(logging.INFO if report.ok else logging.WARNING, "%s", _prefixed(str(report)))
        return result

    init_process_group._torch_overlay_checks_ranks = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


def install() -> None:
    """Wrap ``init_process_group`` when ``torch.distributed`` is imported (before its re-export)."""
    import sys

    if C10D in sys.modules:
        _wrap(sys.modules[C10D])
        torch_dist = sys.modules.get("torch.distributed")
        if torch_dist is not None and hasattr(torch_dist, "init_process_group"):
            torch_dist.init_process_group = sys.modules[C10D].init_process_group  # type: ignore[attr-defined]
        return
    process_overlay().on_import(C10D, lambda name: _wrap(sys.modules[name]))
