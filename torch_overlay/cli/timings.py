"""How long each reproducer run took last time, kept in the user's cache folder for estimates."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["Timings", "cache_dir"]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/torch_overlay`` (default ``~/.cache/torch_overlay``), beside the venvs."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "torch_overlay"


class Timings:
    """Seconds per run key (``<id> without``, ``<id> with``) for one torch version and mode."""

    def __init__(self, torch_version: str, mode: str, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "verify-times.json"
        self.section = f"{torch_version} {mode}"
        self.seconds: dict[str, float] = self._load().get(self.section, {})

    def _load(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> float | None:
        return self.seconds.get(key)

    def save(self, measured: dict[str, float]) -> None:
        """Merge ``measured`` into the file; a read-only cache only loses the estimate."""
        data = self._load()
        data[self.section] = {**data.get(self.section, {}), **{k: round(v, 1) for k, v in measured.items()}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            pass
