"""torch_overlay: fixes for PyTorch internals, applied to the installed torch as it is imported.

``import torch_overlay`` (before torch's internals are imported) reads ``patches/series``; each
module a patch changes then executes its patched source when it is first imported. Nothing heavy is
imported here. See ``python -m torch_overlay status``. The CLI's own processes activate the overlay
only for the verbs that report on it: ``explain`` and the build tools read the series as data.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ._state import Mode, OverlayError, OverlayWarning, PatchState, PatchStatus, Target
from ._version import __version__
from .engine.overlay import process_overlay
from .launch.env import inherit

__all__ = [
    "Mode",
    "__version__",
    "OverlayError",
    "OverlayWarning",
    "PatchState",
    "PatchStatus",
    "RanksReport",
    "ReplicaDivergenceError",
    "ReplicaDivergenceWarning",
    "ReplicaMismatch",
    "ReplicaReport",
    "Target",
    "check_ranks",
    "check_replicas",
    "get_original",
    "guard_replicas",
    "is_patched",
    "reach",
    "revert",
    "status",
]

# The verbs of `python -m torch_overlay` (and `torch-overlay`) that need the overlay active in their
# own process; `run` is the launcher. The others, and `python -m torch_overlay.tools`, read data only.
_CLI_VERBS_WITH_OVERLAY = ("status", "warm", "verify", "run")


def _activates() -> bool:
    """True but in a process of the CLI or the build tools whose verb needs no overlay (what the
    command line names, read before that command's module runs); a training job always activates."""
    argv = getattr(sys, "argv", None) or [""]
    orig = getattr(sys, "orig_argv", [])
    if argv[0] == "-m" and len(orig) >= len(argv):
        # `python -m X ARGS` imports X's packages while argv is ["-m", *ARGS]: X comes just before ARGS.
        main = orig[len(orig) - len(argv)].removeprefix("-m")
    elif os.path.basename(argv[0]) == "torch-overlay":  # the console script
        main = "torch_overlay"
    else:
        return True
    if main in ("torch_overlay", "torch_overlay.__main__", "torch_overlay.cli.main"):
        return len(argv) > 1 and argv[1] in _CLI_VERBS_WITH_OVERLAY
    return main != "torch_overlay.tools" and not main.startswith("torch_overlay.tools.")


def _install_hint(overlay: Any) -> None:
    """After whatever ``sys.excepthook`` prints, one line when the error is a known bug whose fix
    is not active here (known/hint.py, imported only when an exception escapes); once per process."""
    previous = sys.excepthook
    if getattr(previous, "_torch_overlay_hint", False):
        return

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        try:
            from .known.hint import after_traceback
        except Exception:  # noqa: BLE001 - a hint must never hide or replace the traceback
            return
        after_traceback(overlay, exc)

    excepthook._torch_overlay_hint = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


_overlay = process_overlay()
if _activates():
    _overlay.activate()
    # TORCH_OVERLAY_REACH=1: how often each fix's changed functions run (engine/reach.py; nothing when off).
    if _overlay.config.enabled and _overlay.config.reach:
        _overlay.count_reach()
    # Under TORCH_OVERLAY_STRICT=1 the warnings that the series adds to torch's code raise too.
    if _overlay.config.enabled and _overlay.config.strict:
        from .engine.strict_warnings import install as _raise_patch_warnings

        _raise_patch_warnings()
    # After a traceback, one line when the error is a known bug whose fix is not active here.
    _install_hint(_overlay)
    # Python processes started from here on import the overlay first, with this process's switches.
    if _overlay.config.enabled and _overlay.config.children and not inherit(os.environ):
        _overlay.report_problem(
            "the package lacks its bootstrap folder (launch/_bootstrap/sitecustomize.py): child processes "
            "started from here (mp.spawn, DataLoader workers) run without the overlay; reinstall torch_overlay"
        )


def status() -> list[PatchStatus]:
    """Each patch's state in this process: applied, upstream, drift, disabled, pending or failed."""
    return _overlay.status()


def revert() -> list[str]:
    """Undo every patch that can be undone in this process (swapped code); nothing applies afterwards.

    Returns one line per patch that a module executed at import: those need a new process
    (``TORCH_OVERLAY_DISABLE=<id>``).
    """
    return _overlay.revert()


def reach() -> list[dict[str, Any]] | None:
    """Per applied fix, how often this process ran the functions it changed (``calls``; None for a
    fix that changed only definitions) and, for a silent bug, what a run without it does
    (``silent``); None unless ``TORCH_OVERLAY_REACH=1``."""
    return None if _overlay.reach is None else _overlay.reach.report()


def is_patched(obj: object) -> bool:
    """Whether ``obj`` (a function, method or class of torch) runs code a patch changed."""
    return _overlay.is_patched(obj)


def get_original(obj: Any) -> Any:
    """The function as the installed torch ships it (``obj`` itself if no patch changed it)."""
    return _overlay.get_original(obj)


_LAZY = {
    "check_replicas": "torch_overlay.checks.replicas",
    "guard_replicas": "torch_overlay.checks.replicas",
    "ReplicaReport": "torch_overlay.checks.replicas",
    "ReplicaDivergenceError": "torch_overlay.checks.replicas",
    "ReplicaDivergenceWarning": "torch_overlay.checks.replicas",
    "ReplicaMismatch": "torch_overlay.checks.replicas",
    "check_ranks": "torch_overlay.checks.ranks",
    "RanksReport": "torch_overlay.checks.ranks",
}


def __getattr__(name: str) -> Any:
    # The replica checker imports torch.distributed; keep `import torch_overlay` light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torch_overlay' has no attribute {name!r}")
