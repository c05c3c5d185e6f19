"""Under ``TORCH_OVERLAY_STRICT=1``, the warnings that the series adds to torch raise.

A fix that warns does so in torch's own code, as it would upstream: a ``UserWarning`` with its own
text, not an ``OverlayWarning`` (that one is the overlay's voice about itself). Strict mode turns
exactly those warnings into errors with a ``warnings`` filter on their text and module, so the job
stops where the warning is given (the exception is the warning itself); nothing of torch is
wrapped, and no torch module is imported for it.
"""

from __future__ import annotations

import warnings

__all__ = ["PATCH_WARNINGS", "install"]

# (fix id, message regex, module regex): each warning a patch of the series adds to torch.
PATCH_WARNINGS = (
    (
        "fsdp-unused-params-backward-order",
        r"FSDP module .*set_reduce_scatter_unused_params\(True\)",
        r"torch\.distributed\.fsdp\._fully_shard\._fsdp_state\Z",
    ),
    # Given at the caller's line (stacklevel=2): any module.
    ("dtensor-data-setter", r"Setting \.data of a DTensor to a plain tensor", r""),
)


def install() -> None:
    """Make each warning of ``PATCH_WARNINGS`` an error (a filter in front of the others)."""
    for _, message, module in PATCH_WARNINGS:
        warnings.filterwarnings("error", message=message, category=UserWarning, module=module)
