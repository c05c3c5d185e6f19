"""``torch-overlay explain [FILE ...]``: is this crash a known torch bug, and is it fixed here?

Exit status: 0 when every error found is a known bug (or possibly one: the paste lacks the frame
or class that would make it sure), 1 when one is not (or no error was found),
2 when an input cannot be read (missing, a device or folder, binary, over 64 MiB: refused before
more than its head is read). Torch is never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path
from typing import BinaryIO

from ..known.catalogue import CatalogueError, load_catalogue
from ..known.verdicts import broken_on, explain_log, Explanation
from ..known.signatures import POSSIBLY

__all__ = ["format_explanations", "run_explain"]


# A job log with the error in it is megabytes; more is not a log (or needs cutting to the error).
_MAX_BYTES = 64 << 20


def _read(name: str) -> str:
    """The text of ``name`` (``-``: standard input), read up to :data:`_MAX_BYTES`; ValueError for
    what is not a log: a device or folder (``/dev/zero`` never ends), too large, or binary."""
    if name == "-":
        return _read_text(sys.stdin.buffer)
    # Pipes are logs too (`explain <(journalctl ...)`); a device is never one, and may never end.
    if not (stat.S_ISREG(mode := os.stat(name).st_mode) or stat.S_ISFIFO(mode)):
        raise ValueError("not a regular file")
    with open(name, "rb") as file:
        return _read_text(file)


def _read_text(file: BinaryIO) -> str:
    # The head first: binary input is refused before more of it is read.
    data = file.read(65536)
    undecodable = data.decode("utf-8", errors="replace").count("\ufffd")
    if b"\0" in data[:8192] or undecodable > 8 + len(data) // 100:
        raise ValueError("binary data, not a log")
    if len(data) == 65536:
        data += file.read(_MAX_BYTES + 1 - len(data))
    if len(data) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES >> 20} MiB: pass the part of the log around the error")
    return data.decode("utf-8", errors="replace")


def _installed_torch() -> str | None:
    from ..series.versions import torch_version

    try:
        return torch_version()
    except ImportError:
        return None


def _drift_check(patches_dir: Path, version: str):
    """A function telling, per patch id, why it drifts on the installed torch (None: it does not).
    The series is walked over the installed files once, on first use."""
    steps: dict[str, str] | None = None

    def drifted(pid: str) -> str | None:
        nonlocal steps
        if steps is None:
            from .._state import PatchState
            from ..series.plan import load_series, plan_series
            from ..series.versions import torch_root

            root = torch_root()

            def read(path: str) -> str | None:
                file = root / path
                return file.read_text(encoding="utf-8") if file.is_file() else None

            try:
                plan = plan_series(load_series(patches_dir), version, read, python_only=True)
                steps = {s.patch.id: s.reason for s in plan.steps if s.state == PatchState.DRIFT}
            except Exception:  # noqa: BLE001 - the answer then comes from the fields alone
                steps = {}
        return steps.get(pid)

    return drifted


def format_explanations(explanations: list[Explanation], torch: str | None, width: int = 100) -> str:
    if not explanations:
        return "no error found: paste the traceback, or the job's whole log (every rank's output)"
    lines = []
    wrap = textwrap.TextWrapper(width=max(width, 60), initial_indent="    ", subsequent_indent="    ")
    for n, ex in enumerate(explanations, 1):
        ranks = f" (rank {', '.join(ex.error.ranks)})" if ex.error.ranks else ""
        headline = ex.error.headline
        if len(headline) > width:
            headline = headline[: width - 3] + "..."
        lines.append(f"error {n} of {len(explanations)}{ranks}: {headline}")
        if not ex.matches:
            lines.append("  not a known bug: no fix of this series or report looked at matches this error")
        for match in ex.matches:
            bug = match.bug
            what = "fix" if bug.kind == "fix" else "looked at, not taken"
            if match.confidence == POSSIBLY:
                lines.append(f"  possibly a known bug: {bug.id} ({what}; {bug.link_names}): {bug.title}")
                lines.extend(
                    wrap.wrap(
                        "the message matches, but the paste lacks what tells this bug from others with the same "
                        "message (its traceback frames or exception class): paste the whole traceback to be sure"
                    )
                )
            else:
                lines.append(f"  known bug: {bug.id} ({what}; {bug.link_names}): {bug.title}")
            lines.append(f"    broken on torch {broken_on(bug)}")
            lines.extend(wrap.wrap(match.advice))
    return "\n".join(lines)


def run_explain(args: argparse.Namespace, patches_dir: Path) -> int:
    """``explain``: read each input, match its errors against the catalogue, print the verdicts."""
    texts = []
    for name in args.files or ["-"]:
        try:
            texts.append(_read(name))
        except (OSError, ValueError) as exc:
            print(f"error: cannot read {'standard input' if name == '-' else name}: {exc}", file=sys.stderr)
            return 2
    try:
        catalogue = load_catalogue(patches_dir)
    except CatalogueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    installed = args.torch is None
    torch = _installed_torch() if installed else args.torch
    if not installed:
        from ..series.versions import parse_version

        try:
            parse_version(torch)
        except ValueError:
            print(f"error: --torch {torch!r} is not a torch version (e.g. --torch 2.13.0)", file=sys.stderr)
            return 2
    drifted = _drift_check(patches_dir, torch) if installed and torch else (lambda pid: None)
    explanations = explain_log(
        "\n".join(texts), catalogue, torch, installed=installed and torch is not None, drifted=drifted
    )
    if args.json:
        text = json.dumps({"torch": torch, "errors": [e.as_dict() for e in explanations]}, indent=2)
    else:
        text = format_explanations(explanations, torch, shutil.get_terminal_size((100, 24)).columns - 4)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `explain ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for problem in catalogue.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0 if explanations and all(e.known for e in explanations) else 1
