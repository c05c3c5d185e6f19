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

from .._config import PATH_SWITCHES, switch_path

__all__ = ["BOOTSTRAP", "inherit", "launch_env"]

BOOTSTRAP = Path(__file__).resolve().parent / "_bootstrap"


def launch_env(environ: Mapping[str, str], *, check_ranks: str | None = None) -> dict[str, str]:
    """``environ`` with the bootstrap first on ``PYTHONPATH`` (and this package importable).

    ``check_ranks`` (``warn`` or ``fail``) sets ``TORCH_OVERLAY_CHECK_RANKS`` for every process.
    """
    env = dict(environ)
    env["PYTHONPATH"] = _pythonpath(env.get("PYTHONPATH", ""))
    _absolute_paths(env)
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
    _absolute_paths(environ)
    return True


def _pythonpath(old: str) -> str:
    """The bootstrap, the user's entries exactly as given, then the source checkout if needed.

    The bootstrap must come first: a ``sitecustomize`` earlier on the path would shadow it (it holds
    nothing else, and runs the one it shadows). The user's entries keep their order and their empty
    ones (an empty entry is the current folder: ``PYTHONPATH=$PYTHONPATH:/opt/x`` makes one), and
    come before our checkout's folder, so that a package of theirs is never shadowed by one of ours.
    """
    bootstrap = str(BOOTSTRAP)
    # An unset or empty PYTHONPATH has no entry: "" would add the current folder.
    rest = [p for p in old.split(os.pathsep) if p != bootstrap] if old else []
    package_parent = str(BOOTSTRAP.parents[2])
    # (not Path.match: its fnmatch compiles two regular expressions at every `import torch_overlay`)
    checkout = os.path.basename(package_parent) not in ("site-packages", "dist-packages")
    if checkout and package_parent not in rest:
        rest.append(package_parent)  # a source checkout: the children must find torch_overlay
    return os.pathsep.join([bootstrap, *rest])


def _absolute_paths(environ: MutableMapping[str, str]) -> None:
    """Hand the path-valued switches on as absolute paths: a child may start in another folder."""
    for name in PATH_SWITCHES:
        value = environ.get(name, "")
        if value.strip():
            absolute = switch_path(value)
            if absolute != value:
                environ[name] = absolute
