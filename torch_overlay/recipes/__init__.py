"""Compile-safe helpers for patterns that torch does not support directly.

Unlike ``patches/``, recipes are new user-facing code: they change nothing in torch and work with
or without the overlay's fixes. Each lives in its own module; import what you use::

    from torch_overlay.recipes import use_local_param_views
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LocalParamViewsHandle", "use_local_param_views"]

# Recipes import torch.distributed; load a recipe's module only when one of its names is used.
_LAZY = {
    "LocalParamViewsHandle": "torch_overlay.recipes.local_params",
    "use_local_param_views": "torch_overlay.recipes.local_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torch_overlay.recipes' has no attribute {name!r}")
