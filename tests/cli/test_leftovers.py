"""A reproducer run leaves the temporary folder as it found it.

The run gets a private ``TMPDIR`` (other agents and jobs write to ``/tmp`` at the same time): what
the run made there is what the check sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A small in-process reproducer on torch's DTensorTestBase, whose setUp makes a rendezvous file.
QUICK_ID = "dtensor-new-empty-partial"


def _ours(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.startswith(("torch_overlay", "tmp"))}


def test_verify_quick_of_one_fix_leaves_the_temporary_folder_as_it_found_it(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(temp), XDG_CACHE_HOME=str(tmp_path / "cache"))
    before = _ours(temp)
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "verify", "--quick", QUICK_ID],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "could not run" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _ours(temp) == before


def test_the_test_suite_removes_the_overlay_cache_it_made(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    one_test = "tests/test_import_circles.py::test_the_circle_finder_finds_a_loop"  # any test; tests/conftest.py runs
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", one_test],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _ours(tmp_path) == set()
