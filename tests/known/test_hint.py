"""The line after an uncaught exception: a known bug whose fix is not active in the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Raised in the scripts below: the text of dtensor-is-any-true-strategy's bug, which its message alone
# names (a message that other causes print too gets no line: it is at most *possibly* that bug).
RAISE = 'raise NotImplementedError("Operator aten._is_any_true.default does not have a sharding strategy registered.")'
FIX = "dtensor-is-any-true-strategy"


def _run(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY") and k != "RANK"}
    full.update(PYTHONPATH=str(REPO), TORCH_OVERLAY_CACHE_DIR=os.environ["TORCH_OVERLAY_CACHE_DIR"], **env)
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
    )


def _hint_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("torch_overlay: this error is")]


def test_disabled_fix_gets_one_line_after_the_traceback():
    proc = _run(f"import torch_overlay\n{RAISE}\n", TORCH_OVERLAY_DISABLE=FIX)
    lines = proc.stderr.rstrip().splitlines()
    assert proc.returncode == 1
    assert lines[0] == "Traceback (most recent call last):"
    # The traceback, unchanged, first.
    assert lines[-2].startswith("NotImplementedError: Operator aten._is_any_true"), lines
    assert lines[-1].startswith("torch_overlay: this error is a known torch bug (pytorch#170936"), lines
    assert f"{FIX} fixes, but that fix is disabled in this process: TORCH_OVERLAY_DISABLE" in lines[-1]
    assert f"Remove {FIX} from TORCH_OVERLAY_DISABLE" in lines[-1]
    assert len(_hint_lines(proc.stderr)) == 1


def test_late_import_gets_the_import_first_remedy():
    proc = _run(
        f"""
        import torch.distributed.tensor._ops._math_ops  # before the overlay: the late path
        import torch_overlay
        state = {{r.id: r.state for r in torch_overlay.status()}}["{FIX}"]
        print(state)
        {RAISE}
        """
    )
    if proc.stdout.strip() != "failed":
        pytest.skip(f"{FIX} is {proc.stdout.strip()} on this torch after a late import")
    (line,) = _hint_lines(proc.stderr)
    assert "was imported before torch_overlay" in line and "Import torch_overlay first" in line


def test_no_line_when_the_fix_is_active_or_the_error_unknown_or_not_rank_0():
    assert not _hint_lines(_run(f"import torch_overlay\n{RAISE}\n").stderr)
    assert not _hint_lines(
        _run(
            "import torch_overlay\nraise RuntimeError('shape mismatch in my model')\n", TORCH_OVERLAY_DISABLE=FIX
        ).stderr
    )
    assert not _hint_lines(_run(f"import torch_overlay\n{RAISE}\n", TORCH_OVERLAY_DISABLE=FIX, RANK="1").stderr)


def test_matching_is_lazy():
    """Nothing of known/ is imported until an exception escapes (import torch_overlay chains the hook)."""
    proc = _run(
        "import sys, torch_overlay\nprint(sorted(m for m in sys.modules if m.startswith('torch_overlay.known')))"
    )
    assert proc.stdout.strip() == "[]", proc.stdout
