"""pytest without and with the overlay: how ``verify``, ``build.sh compare`` and the captures run tests.

One run is one pytest process for one side. Its environment has ``TORCH_OVERLAY=1`` or ``0`` (never a
``TORCH_OVERLAY_DISABLE``), the launcher's bootstrap first on ``PYTHONPATH`` so that every Python the
tests start imports the overlay first, the tests' folder and this checkout importable, and fresh
inductor caches and ``TMPDIR`` in the run's scratch folder. The process gets a session of its own: a
timeout, an interruption, or pytest's end kills its whole group, the ranks a test spawned included.
Each test's outcome is read from pytest's JUnit XML report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..launch.env import launch_env

__all__ = ["CaseResult", "PytestRun", "PytestRunner", "STATES", "read_junit", "side_env"]

STATES = ("pass", "fail", "error", "skipped")
_TAGS = (("failure", "fail"), ("error", "error"), ("skipped", "skipped"))
_TAIL_LINES = 20
# How long to wait for the output's end once the group is killed: a process that left the group
# (a session of its own) may still hold it open, and it is not waited for.
_DRAIN_S = 10.0


@dataclass(frozen=True)
class CaseResult:
    """One test of a JUnit report."""

    state: str  # one of STATES
    message: str = ""  # the failure's (error's, skip's) message: pytest cuts it after a few lines
    text: str = ""  # the element's text: the whole report of the failure
    seconds: float = 0.0  # setup, call and teardown


@dataclass(frozen=True)
class PytestRun:
    """What one pytest process gave."""

    cases: dict[str, CaseResult]  # ``classname::name`` -> result, in the report's order
    reported: bool  # whether pytest wrote a readable JUnit report
    returncode: int
    timed_out: bool
    tail: list[str]  # the last lines of its output
    seconds: float

    @property
    def last_line(self) -> str:
        return next((line for line in reversed(self.tail) if line), "")


def read_junit(report: Path) -> dict[str, CaseResult]:
    """``classname::name`` -> result, from pytest's JUnit XML report (OSError or ParseError if unreadable)."""
    out: dict[str, CaseResult] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        result = _case_result(case)
        first = out.get(key)
        if first is not None:
            # A test that failed and then errored in its teardown is reported twice: its failure counts.
            kept = first if first.state != "pass" else result
            result = replace(kept, seconds=first.seconds + result.seconds)
        out[key] = result
    return out


def _case_result(case: ET.Element) -> CaseResult:
    seconds = float(case.get("time") or 0.0)
    for tag, state in _TAGS:
        child = case.find(tag)
        if child is not None:
            return CaseResult(state, child.get("message") or "", child.text or "", seconds)
    return CaseResult("pass", seconds=seconds)


def side_env(
    overlay: bool,
    scratch: Path,
    *,
    folder: Path | None = None,
    user_switches: bool = True,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a run with or without the overlay, its temporary files under ``scratch``.

    ``folder`` (the tests' folder) goes on ``PYTHONPATH`` before the user's entries, so that a test's
    children import its modules as pytest does; ``user_switches=False`` drops the caller's
    ``TORCH_OVERLAY*`` variables; ``extra`` is set last.
    """
    env = {k: v for k, v in os.environ.items() if user_switches or not k.startswith("TORCH_OVERLAY")}
    if folder is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    env = launch_env(env)
    env["TORCH_OVERLAY"] = "1" if overlay else "0"
    env.pop("TORCH_OVERLAY_DISABLE", None)
    # Fresh compile caches for each run, so that neither side reuses the other's graphs.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
    # Temporary files go with the run: torch's MultiProcessTestCase leaves a rendezvous file per test.
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(scratch / "tmp")
    # A run ended at its timeout is killed: unbuffered, what it printed up to then is in its output.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class PytestRunner:
    """Runs pytest processes (from one thread or several) and can end them all at once (``kill_all``)."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()

    def run(
        self,
        args: Sequence[str],
        *,
        overlay: bool,
        scratch: Path,
        cwd: Path,
        plugins: Iterable[str] = (),
        timeout: float | None = None,
        user_switches: bool = True,
        extra_env: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> PytestRun:
        """``python -m pytest ARGS`` in ``cwd``, its report and temporary files in ``scratch``.

        ``on_line`` gets each line of its output (stdout and stderr), from a thread of its own.
        """
        scratch.mkdir(parents=True, exist_ok=True)
        report = scratch / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts="]
        for plugin in plugins:
            cmd += ["-p", plugin]
        cmd += [f"--junitxml={report}", *args]
        env = side_env(overlay, scratch, folder=cwd, user_switches=user_switches, extra=extra_env)
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        with self._lock:
            self._procs.add(proc)
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        tail_lock = threading.Lock()
        reader = threading.Thread(target=_read, args=(proc, tail, tail_lock, on_line), daemon=True)
        reader.start()
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            _kill_group(proc)

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            # Ended but not reaped: its pid still names the group, which may hold children it left.
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        finally:
            if timer is not None:
                timer.cancel()
            _kill_group(proc)  # a child left behind would hold the output open; an interruption ends all
            rc = proc.wait()
            reader.join(_DRAIN_S)
            with self._lock:
                self._procs.discard(proc)
        seconds = time.monotonic() - start
        try:
            cases, reported = read_junit(report), True
        except (OSError, ET.ParseError):
            cases, reported = {}, False
        with tail_lock:
            lines = list(tail)
        return PytestRun(cases, reported, rc, timed_out.is_set(), lines, seconds)

    def kill_all(self) -> None:
        with self._lock:
            for proc in list(self._procs):
                _kill_group(proc)


def _read(
    proc: subprocess.Popen[str], tail: deque[str], lock: threading.Lock, on_line: Callable[[str], None] | None
) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            tail.append(line.rstrip())
        if on_line is not None:
            on_line(line)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone
