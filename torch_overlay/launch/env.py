"""The environment that makes every Python child process import torch_overlay first.

A folder whose ``sitecustomize`` imports torch_overlay goes first on ``PYTHONPATH``. The launcher
runs a job with it; ``import torch_overlay`` puts it in its own process's environment, so that
children it starts (``mp.spawn``, spawn and forkserver DataLoader workers, ``subprocess``
Pythons) inherit the overlay and the parent's switches, unless ``TORCH_OVERLAY_CHILDREN=0``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

__all__ = ["BOOTSTRAP", "inherit", "launch_env"]

BOOTSTRAP = Path(__file__).resolve().parent / "_bootstrap"


def launch_env(environ: Mapping[str, str], *, check_ranks: str | None = None) -> dict[str, str]:
    """``environ`` with the bootstrap first on ``PYTHONPATH`` (and this package importable).

    ``check_ranks`` (``warn`` or ``fail``) sets ``TORCH_OVERLAY_CHECK_RANKS`` for every process.
    """
    env = dict(environ)
    env["PYTHONPATH"] = _pythonpath(env.get("PYTHONPATH", ""))
    if check_ranks:
        env["TORCH_OVERLAY_CHECK_RANKS"] = check_ranks
    return env


def inherit(environ: MutableMapping[str, str]) -> bool:
    """Put the bootstrap on ``environ``'s ``PYTHONPATH``; False when the package lacks it."""
    if not (BOOTSTRAP / "sitecustomize.py").is_file():
        return False
    path = _pythonpath(environ.get("PYTHONPATH", ""))
    if environ.get("PYTHONPATH") != path:
        environ["PYTHONPATH"] = path
    return True


def _pythonpath(old: str) -> str:
    parts = [str(BOOTSTRAP)]
    package_parent = str(BOOTSTRAP.parents[2])
    # (not Path.match: its fnmatch compiles two regular expressions at every `import torch_overlay`)
    if os.path.basename(package_parent) not in ("site-packages", "dist-packages"):
        parts.append(package_parent)  # a source checkout: the children must find torch_overlay
    rest = [p for p in old.split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts + rest)
