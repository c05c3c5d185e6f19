"""One voice per job: which process of a job warns about a problem of the switches.

``torch-overlay-run torchrun ...`` runs the overlay in the launcher, the torchrun agent and every
rank, all with the same environment, so a switch typo would be warned once per process. A process
stays quiet about a problem (DEBUG log only) when

- a process it descends from already said it: a process that says a problem adds its hash to its
  environment (``TORCH_OVERLAY_REPORTED``), which the processes it starts inherit; or
- it is a torchrun rank other than 0 (``RANK``, else ``LOCAL_RANK``): rank 0 has the same switches.

A single process (no rank, nothing inherited about that value) always says it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping

from .._config import REPORTED

__all__ = ["REPORTED", "pass_on", "said_elsewhere", "says"]

log = logging.getLogger("torch_overlay")


def _key(message: str) -> str:
    import hashlib  # only when there is a problem to report: `import torch_overlay` stays light

    # The message holds the value, so a child whose switch was changed is told again.
    return hashlib.sha256(message.encode()).hexdigest()[:12]


def _keys(environ: Mapping[str, str]) -> list[str]:
    return [k for k in environ.get(REPORTED, "").split(",") if k]


def said_elsewhere(message: str, environ: Mapping[str, str]) -> bool:
    """Whether another process of this job says ``message``: rank 0, or a parent that did."""
    rank = environ.get("RANK", environ.get("LOCAL_RANK", "")).strip()
    return rank not in ("", "0") or _key(message) in _keys(environ)


def pass_on(message: str, environ: MutableMapping[str, str]) -> None:
    """Record in ``environ`` that ``message`` was said, so the processes started from here keep quiet."""
    keys = _keys(environ)
    if _key(message) not in keys:
        environ[REPORTED] = ",".join([*keys, _key(message)])


def says(message: str, environ: MutableMapping[str, str] | None) -> bool:
    """Whether this process warns ``message``; if so it is passed on in ``environ`` (None: nowhere)."""
    if said_elsewhere(message, os.environ):
        log.debug("%s (said by another process of this job)", message)
        return False
    if environ is not None:
        pass_on(message, environ)
    return True
