"""What each fix's reproducer raises without the overlay, on the installed torch.

``explain`` recognises a bug by the ``Error:`` lines of its patch; torch rewords its messages
between releases, so those lines are checked against the text each release really prints. This
module runs each needed fix's ``Error-Test`` (default: its ``Quick-Test``) once without the
overlay, in one pytest process (``cli/pytest_runner``), and keeps the exception it raised,
compacted: the frames' files and functions and the exception lines of the chain, without source
lines or the venv's path. A
reproducer that fails on the test's own comparison (an ``AssertionError`` from the test or from
``torch.testing``) shows a *silent* bug: torch raised nothing.

``build.sh matrix`` runs it on each supported torch and stores the result in
``patches/captured/<release>.json``; ``tests/known/test_captured_errors.py`` checks that ``explain``
names each fix for its captured text on every release, and that the installed torch still raises
what is stored.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

from ..cli.pytest_runner import PytestRunner
from ..series.decide import fitting_variants
from ..series.series import Patch
from ..series.versions import parse_version

__all__ = [
    "capture",
    "compact_exception",
    "error_test",
    "headline",
    "is_silent",
    "merge_captured",
    "release_of",
    "run_capture",
]

_SITE = re.compile(r"^.*?/(?:site|dist)-packages/|^.*?/lib/(?=python3\.\d+/)")
_ASSERTION_FRAMES = ("/unittest/", "torch/testing/", "tests/")


def release_of(version: str) -> str:
    """``"2.13.0+cpu"`` -> ``"2.13.0"``."""
    return ".".join(map(str, parse_version(version)))


def error_test(patch: Patch, version: str) -> str | None:
    """The pytest node whose failure without the fix shows ``patch``'s error on torch ``version``:
    the fitting variant's ``Error-Test`` or ``Quick-Test``, else the main file's."""
    main = patch.main
    if main is None:
        return None
    fitting = fitting_variants(patch, version)
    sources = [fitting[0], main] if fitting else [main]
    for field in ("Error-Test", "Quick-Test"):
        for variant in sources:
            if variant.fields.get(field):
                return variant.fields[field]
    return None


def _short_path(path: str, repo: str) -> str:
    if repo and path.startswith(repo + os.sep):
        return path[len(repo) + 1 :]
    return _SITE.sub("", path)


def compact_exception(exc: BaseException, repo: str = "") -> str:
    """``exc`` as Python prints it uncaught, its chain included, without source lines, carets
    or the folder torch is installed in (frames read ``File "torch/x.py", line N, in f``)."""
    te: traceback.TracebackException | None = traceback.TracebackException.from_exception(exc, capture_locals=False)
    chain: list[traceback.TracebackException] = []
    while te is not None:
        chain.append(te)
        te = te.__cause__ or (te.__context__ if not te.__suppress_context__ else None)
    parts: list[str] = []
    for n, link in enumerate(reversed(chain)):
        if n:
            cause = chain[len(chain) - n].__cause__ is not None
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if cause
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        if link.stack:
            parts.append("Traceback (most recent call last):\n")
            for frame in link.stack:
                parts.append(f'  File "{_short_path(frame.filename, repo)}", line {frame.lineno}, in {frame.name}\n')
        parts.extend(link.format_exception_only())
    return "".join(parts)


def is_silent(text: str) -> bool:
    """Whether a compacted exception is the test's own comparison failing (wrong values, torch
    raised nothing): an ``AssertionError`` whose innermost frame is the test or ``torch.testing``."""
    lines = text.rstrip().splitlines()
    frames = [line for line in lines if line.startswith('  File "')]
    last_type = next((line for line in reversed(lines) if re.match(r"^[A-Za-z_][\w.]*(:|$)", line)), "")
    if not last_type.startswith("AssertionError"):
        return False
    return not frames or any(mark in frames[-1] for mark in _ASSERTION_FRAMES)


def _outcome(text: str) -> str:
    if is_silent(text):
        return "silent"
    line = headline(text)
    if "Connection reset by peer" in line or "Connection closed by peer" in line:
        return "peer"
    if "terminated or timed out after" in line:  # a multi-process test that ran out of time
        return "timeout"
    return "error"


def headline(text: str) -> str:
    """The last exception line of a compacted text, numbers and addresses made ``#``: what two
    captures of one bug on one torch have in common."""
    lines = text.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_][\w.]*(: |$)", line)]
    first = lines[starts[-1]] if starts else (lines[-1] if lines else "")
    # A set printed in a message has no order ({torch.bfloat16, torch.float32} or the reverse).
    first = re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", first)
    return re.sub(r"0x[0-9a-f]+|\d+", "#", " ".join(first.split()))


def capture(patches: list[Patch], repo: Path, version: str, *, timeout: float = 1800.0) -> dict[str, dict[str, object]]:
    """Run the reproducers of ``patches`` without the overlay; id -> ``{"test", "outcome", "text"}``
    with outcome ``error`` (torch raised), ``silent`` (the test's comparison failed), ``peer`` (a
    multi-process test whose reported rank only lost its peer: the rank that raised is not in the
    text), ``timeout`` (a multi-process test ran out of time: nothing learnt) or ``passes``."""
    nodes = {p.id: node for p in patches if (node := error_test(p, version))}
    if not nodes:
        return {}
    with tempfile.TemporaryDirectory(prefix="torch_overlay-capture-") as tmp:
        out = Path(tmp) / "captured.json"
        extra = {
            "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",  # torch's tests append a "to execute this test" note
            "CAPTURE_EXCEPTIONS_JSON": str(out),
            "CAPTURE_REPO": str(repo),
            "TORCH_OVERLAY_CACHE_DIR": str(Path(tmp) / "overlay-cache"),
        }
        # What ran is in the file, rewritten after each test: a timeout leaves the rest "timeout".
        PytestRunner().run(
            ["-q", *sorted(set(nodes.values()))],
            overlay=False,
            scratch=Path(tmp),
            cwd=repo,
            plugins=["torch_overlay.tools.capture_plugin"],
            timeout=timeout,
            user_switches=False,
            extra_env=extra,
        )
        ran: dict[str, str | None] = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    result: dict[str, dict[str, object]] = {}
    for pid, node in nodes.items():
        if node not in ran:
            result[pid] = {"test": node, "outcome": "timeout"}
            continue
        text = ran[node]
        if text is None:
            result[pid] = {"test": node, "outcome": "passes"}
        else:
            result[pid] = {"test": node, "outcome": _outcome(text), "text": text}
    return result


def merge_captured(path: Path, version: str, captured: dict[str, dict[str, object]], ran: set[str]) -> None:
    """Write ``captured`` into the stored file ``path`` for torch ``version``: the fixes in ``ran``
    get their new entry (or none, when their reproducer passed), the others keep theirs."""
    old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    fixes = {
        k: v for k, v in old.get("fixes", {}).items() if k not in ran or captured.get(k, {}).get("outcome") == "timeout"
    }
    fixes.update({k: v for k, v in captured.items() if v["outcome"] not in ("passes", "timeout")})
    data = {
        "torch": version,
        "note": "what each fix's Error-Test (or Quick-Test) raises without the overlay on this torch; "
        "written by ./build.sh matrix (torch_overlay/tools/capture.py)",
        "fixes": dict(sorted(fixes.items())),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def run_capture(patches_dir: Path, out: Path | None, ids: set[str]) -> int:
    """``python -m torch_overlay.tools capture``: capture the needed fixes (or ``ids``) of the
    installed torch into ``out`` (default ``patches_dir/captured/<release>.json``)."""
    from ..cli.verify import needed_ids
    from ..series.series import read_series
    from ..series.versions import torch_version

    version = torch_version()
    patches = read_series(patches_dir)
    needed = needed_ids(patches)
    chosen = [p for p in patches if p.id in needed and (not ids or p.id in ids)]
    unknown = ids - {p.id for p in patches}
    if unknown:
        print(f"error: no such fix: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[2]
    captured = capture(chosen, repo, version)
    out = out or patches_dir / "captured" / f"{release_of(version)}.json"
    merge_captured(out, version, captured, ids or {p.id for p in patches})
    counts = {
        word: sum(1 for c in captured.values() if c["outcome"] == word)
        for word in ("error", "silent", "passes", "timeout")
    }
    print(
        f"wrote {out}: torch {version}, {len(captured)} reproducers: {counts['error']} raise, "
        f"{counts['silent']} silent (a wrong value), {counts['passes']} pass without the overlay"
        + (f", {counts['timeout']} timed out (their entries kept)" if counts["timeout"] else "")
    )
    return 0
