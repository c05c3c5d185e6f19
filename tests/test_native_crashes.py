"""tests/_native_crashes.py: only a worker killed by a signal runs again, once, and it is said."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A stand-in for MultiProcessTestCase's failure when a worker dies: the same message, no processes.
_TESTS = """
import os
from pathlib import Path

def _fail_once(mark: Path, message: str) -> None:
    if not mark.exists():
        mark.write_text("")
        raise AssertionError(message)

def test_aborts_once(tmp_path_factory):
    _fail_once(tmp_path_factory.getbasetemp().parent / "aborted", "Expected exit code 0 but got -6 for pid: 1")

def test_aborts_always():
    raise AssertionError("Expected exit code 0 but got -11 for pid: 2")

def test_plain_failure_once(tmp_path_factory):
    _fail_once(tmp_path_factory.getbasetemp().parent / "failed", "Expected exit code 0 but got 10 for pid: 3")
"""


def _run(tmp_path: Path, *select: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_standin.py").write_text(_TESTS)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests._native_crashes", "-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"), "-q"]
    cmd += [f"{tmp_path / 'test_standin.py'}::{name}" for name in select]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


def test_a_worker_killed_once_passes_on_its_second_run_and_is_listed(tmp_path):
    proc = _run(tmp_path, "test_aborts_once")
    assert proc.returncode == 0, proc.stdout
    assert "1 passed" in proc.stdout
    assert "native crashes run again" in proc.stdout
    assert "test_aborts_once: a worker died of SIGABRT" in proc.stdout


def test_a_worker_killed_twice_fails(tmp_path):
    proc = _run(tmp_path, "test_aborts_always")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout
    assert "test_aborts_always: a worker died of SIGSEGV" in proc.stdout


def test_any_other_failure_is_not_run_again(tmp_path):
    proc = _run(tmp_path, "test_plain_failure_once")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout
    assert "native crashes run again" not in proc.stdout
