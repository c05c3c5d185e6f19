"""Environment switches, read once per process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Config", "load_config"]


@dataclass(frozen=True)
class Config:
    enabled: bool  # TORCH_OVERLAY=0 turns the overlay off
    disabled_ids: frozenset[str]  # TORCH_OVERLAY_DISABLE=id,id
    strict: bool  # TORCH_OVERLAY_STRICT=1 raises instead of warning
    patches_dir: Path  # TORCH_OVERLAY_PATCHES=dir (default: the shipped series)
    code_cache: bool = True  # TORCH_OVERLAY_CODE_CACHE=0 compiles patched code in memory only
    cache_dir: Path | None = None  # TORCH_OVERLAY_CACHE_DIR (default: $XDG_CACHE_HOME/torch_overlay)


def _truthy(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def default_patches_dir() -> Path:
    here = Path(__file__).resolve().parent
    # A source checkout keeps the series at the top level; an installed package carries a copy.
    for candidate in (here.parent / "patches", here / "patches"):
        if (candidate / "series").is_file():
            return candidate
    return here.parent / "patches"


def default_cache_dir(env: Mapping[str, str]) -> Path:
    root = env.get("TORCH_OVERLAY_CACHE_DIR")
    if root:
        return Path(root)
    return Path(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "torch_overlay"


def load_config(environ: dict[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    disabled = frozenset(
        item.strip() for item in env.get("TORCH_OVERLAY_DISABLE", "").split(",") if item.strip()
    )
    patches = env.get("TORCH_OVERLAY_PATCHES")
    return Config(
        enabled=_truthy(env.get("TORCH_OVERLAY"), True),
        disabled_ids=disabled,
        strict=_truthy(env.get("TORCH_OVERLAY_STRICT"), False),
        patches_dir=Path(patches) if patches else default_patches_dir(),
        code_cache=_truthy(env.get("TORCH_OVERLAY_CODE_CACHE"), True),
        cache_dir=default_cache_dir(env),
    )
