"""``build.sh compare``: a test file without and with the overlay, and what changed."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_overlay.tools.compare import Difference, compare, run_compare

ROOT = Path(__file__).resolve().parents[2]

# No torch: each test reads which side it runs on.
_TESTS = '''
import os
import sys


def test_same():
    pass


def test_broken_by_the_overlay():
    assert os.environ["TORCH_OVERLAY"] == "0"


def test_fixed_by_the_overlay():
    assert os.environ["TORCH_OVERLAY"] == "1"


def test_the_launcher_imported_the_overlay_first():
    assert "torch_overlay" in sys.modules
'''


@pytest.fixture
def test_file(tmp_path: Path) -> Path:
    path = tmp_path / "test_upstream_like.py"
    path.write_text(_TESTS, encoding="utf-8")
    return path


def test_lists_what_changed_and_fails_on_a_regression(test_file: Path) -> None:
    out = io.StringIO()
    assert run_compare(test_file, out=out) == 1
    text = out.getvalue()
    assert "without the overlay: 3 pass, 1 fail, 0 error, 0 skipped" in text
    assert "with the overlay: 3 pass, 1 fail, 0 error, 0 skipped" in text
    assert "REGRESSION test_upstream_like::test_broken_by_the_overlay: pass -> fail" in text
    assert "  test_upstream_like::test_fixed_by_the_overlay: fail -> pass" in text
    assert "test_same" not in text and "launcher" not in text


def test_no_difference_exits_0(test_file: Path) -> None:
    out = io.StringIO()
    assert run_compare(test_file, ["-k", "same or launcher"], out=out) == 0
    assert "no test of test_upstream_like.py changes outcome with the overlay (2 tests)" in out.getvalue()


def test_a_passing_test_that_fails_or_is_gone_with_the_overlay_is_a_regression() -> None:
    diffs = compare(
        {"a": "pass", "b": "pass", "c": "fail", "d": "pass"},
        {"a": "error", "b": "skipped", "c": "pass"},
    )
    assert diffs == [
        Difference("a", "pass", "error"),
        Difference("b", "pass", "skipped"),
        Difference("c", "fail", "pass"),
        Difference("d", "pass", "absent"),
    ]
    assert [d.regression for d in diffs] == [True, False, False, True]


def test_build_sh_compare(test_file: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay.tools", "compare", str(test_file), "--", "-k", "fixed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert textwrap.dedent("""\
        1 test(s) change outcome (without -> with):
          test_upstream_like::test_fixed_by_the_overlay: fail -> pass
        """) in proc.stdout
