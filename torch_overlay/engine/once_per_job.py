"""Once per job: which process of a job warns about a problem of the switches.

``torch-overlay-run torchrun ...`` runs the overlay in the launcher, the torchrun agent and every
rank, all with the same environment, so a switch typo would be warned once per process. A process
stays quiet about a problem (DEBUG log only) when

- a process it descends from already said it: a process that says a problem adds its hash to its
  environment (``TORCH_OVERLAY_REPORTED``), which the processes it starts inherit; or
- it is a torchrun rank other than 0 (``RANK``, else ``LOCAL_RANK``): rank 0 has the same switches.
  Not for what a process did itself: fixes lost because it imported a patched module before the
  overlay depend on the code it ran, which can differ between ranks, so each rank that lost fixes
  says so (``per_rank``).

A single process (no rank, nothing inherited about that value) always says it.

The same rule picks the process that says the job's own lines (:mod:`.overlay`: which torch and how
many fixes when torch is first imported; which fixes were applied at exit): the first process of the
job that imports torch, and rank 0 at its exit. A warning points at the user's code, never at the
overlay's, torch's or importlib's frames (:func:`warn`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from .._config import REPORTED
from .._state import OverlayWarning

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["claim_exit_line", "pass_on", "release_exit_line", "REPORTED", "said_elsewhere", "says", "tell", "warn"]

log = logging.getLogger("torch_overlay")
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep
_IMPORTLIB = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep  # import_module & co
# Where a warning with no user frame to point at is shown (the launcher's processes, at startup).
_NOWHERE = "<torch_overlay>"
_NOWHERE_REGISTRY: dict = {}


def _key(message: str) -> str:
    import hashlib  # only when there is a problem to report: `import torch_overlay` stays light

    # The message holds the value, so a child whose switch was changed is told again.
    return hashlib.sha256(message.encode()).hexdigest()[:12]


def _keys(environ: Mapping[str, str]) -> list[str]:
    return [k for k in environ.get(REPORTED, "").split(",") if k]


def _rank(environ: Mapping[str, str]) -> str:
    return environ.get("RANK", environ.get("LOCAL_RANK", "")).strip()


def said_elsewhere(message: str, environ: Mapping[str, str], per_rank: bool = False) -> bool:
    """Whether another process of this job says ``message``: rank 0 (unless ``per_rank``: what
    this rank did, which rank 0 may not have done), or a parent that did."""
    return (not per_rank and _rank(environ) not in ("", "0")) or _key(message) in _keys(environ)


def pass_on(message: str, environ: MutableMapping[str, str]) -> None:
    """Record in ``environ`` that ``message`` was said, so the processes started from here keep quiet."""
    keys = _keys(environ)
    if _key(message) not in keys:
        environ[REPORTED] = ",".join([*keys, _key(message)])


def says(message: str, environ: MutableMapping[str, str] | None, per_rank: bool = False) -> bool:
    """Whether this process warns ``message``; if so it is passed on in ``environ`` (None: nowhere).
    ``per_rank``: a message about what this process did, said by every rank it concerns."""
    if said_elsewhere(message, os.environ, per_rank):
        log.debug("%s (said by another process of this job)", message)
        return False
    if environ is not None:
        pass_on(message, environ)
    return True


def _exit_key(environ: Mapping[str, str]) -> str:
    # Per rank: a torchrun agent (no RANK) claiming its own exit line leaves rank 0 free to claim its.
    return _key(f"the exit line of rank {_rank(environ) or '-'}")


def claim_exit_line(environ: MutableMapping[str, str]) -> bool:
    """Whether this process says the job's exit line: rank 0 (or a process without a rank), unless
    a parent of the same rank claimed it (a DataLoader worker, an ``mp.spawn`` child)."""
    key = _exit_key(environ)
    if _rank(environ) not in ("", "0") or key in _keys(environ):
        return False
    environ[REPORTED] = ",".join([*_keys(environ), key])
    return True


def release_exit_line(environ: MutableMapping[str, str]) -> None:
    """Give the exit line back (the launcher, which ``exec``s its command: that one says it)."""
    key = _exit_key(environ)
    keys = [k for k in _keys(environ) if k != key]
    if keys:
        environ[REPORTED] = ",".join(keys)
    else:
        environ.pop(REPORTED, None)


def tell(line: str) -> None:
    """Show ``line`` to the user: through their handlers if they set up logging at INFO for
    ``torch_overlay``, else on stderr (never a handler or ``basicConfig`` of ours)."""
    if log.hasHandlers() and log.isEnabledFor(logging.INFO):
        log.info("%s", line)
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no stderr, or closed at exit
        pass


def _ours(filename: str) -> bool:
    """Whether a frame of ``filename`` is the overlay's, torch's or the import machinery's."""
    if filename.startswith((_PACKAGE, _IMPORTLIB, "<frozen ")):
        return True
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file and filename.startswith(os.path.dirname(torch_file) + os.sep):
        return True
    # The console scripts pip writes (`torch-overlay-run`): one line, `from torch_overlay... import`.
    script = sys.argv[0] if sys.argv else ""
    return bool(script) and filename == script and os.path.basename(script).startswith("torch-overlay")


def warn(message: str, category: type[Warning] = OverlayWarning) -> None:
    """``warnings.warn`` at the first frame of the user's code (the line that imported torch or
    torch_overlay), or at no line when there is none (a launcher's process starting up)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        warnings.warn_explicit(message, category, _NOWHERE, 0, module="torch_overlay", registry=_NOWHERE_REGISTRY)
    else:
        module = frame.f_globals.get("__name__", "<string>")
        registry = frame.f_globals.setdefault("__warningregistry__", {})
        # No module_globals: for `python -c` its loader (BuiltinImporter) raises on get_source.
        warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno, module, registry)
    log.debug("%s", message)
