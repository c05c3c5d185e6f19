"""One line after an uncaught exception that is a known bug whose fix is not active here.

``import torch_overlay`` chains a hook after ``sys.excepthook`` that calls :func:`after_traceback`
(this module is imported only then: it costs nothing until an exception escapes). The traceback is
printed first, as before, and only then are the known bugs read and matched (rank 0 only under
torchrun). A fix that is applied, upstream or
not needed says nothing: the error then has another cause.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.overlay import Overlay
    from .signatures import ErrorText

__all__ = ["after_traceback", "hint_for"]

_NOT_ACTIVE = ("disabled", "drift", "failed")


def after_traceback(overlay: Overlay, exc: BaseException) -> None:
    """Print the hint for ``exc``, whose traceback was just printed (rank 0 only); never raises."""
    if os.environ.get("RANK", "0") != "0":
        return
    try:
        line = hint_for(overlay, exc)
    except Exception:  # noqa: BLE001 - a hint must never hide or replace the traceback
        line = None
    if line:
        print(line, file=sys.stderr, flush=True)


def error_text(exc: BaseException) -> ErrorText:
    """``exc`` and its causes as a signature sees them: exception lines and frames."""
    from .signatures import ErrorText

    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    chain.reverse()
    lines = ["".join(traceback.format_exception_only(type(e), e)).rstrip() for e in chain]
    frames = tuple(
        f'File "{f.filename}", line {f.lineno}, in {f.name}'
        for e in chain
        for f in traceback.extract_tb(e.__traceback__)
    )
    return ErrorText("\n".join(lines), tuple(type(e).__name__ for e in chain), frames)


def hint_for(overlay: Overlay, exc: BaseException) -> str | None:
    """The hint for ``exc`` in this process, or None."""
    from .catalogue import load_catalogue

    error = error_text(exc)
    rows = {row.id: row for row in overlay.status()}
    for bug in load_catalogue(overlay.config.patches_dir).fixes():
        row = rows.get(bug.id)
        if row is None or str(row.state) not in _NOT_ACTIVE:
            continue
        if any(sig.matches(error) for sig in bug.signatures):
            return (
                f"torch_overlay: this error is a known torch bug ({bug.link_names}) that {bug.id} fixes, "
                f"but that fix is {row.state} in this process: {row.reason}. {_remedy(str(row.state), row.reason, bug.id)}"
            )
    return None


def _remedy(state: str, reason: str, pid: str) -> str:
    if state == "disabled" and reason == "TORCH_OVERLAY=0":
        return "Unset TORCH_OVERLAY=0 to apply it."
    if state == "disabled":
        return f"Remove {pid} from TORCH_OVERLAY_DISABLE to apply it."
    if "imported before torch_overlay" in reason:
        return "Import torch_overlay first, or start the job with torch-overlay-run."
    return "`python -m torch_overlay status` says more; please report it."
