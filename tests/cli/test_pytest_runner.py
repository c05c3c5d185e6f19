"""``cli/pytest_runner``: one side's pytest run (its environment, its process group) and its JUnit report."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from torch_overlay.cli.pytest_runner import CaseResult, PytestRunner, read_junit, side_env
from torch_overlay.launch.env import BOOTSTRAP

REPO = Path(__file__).resolve().parents[2]

# No torch: each test writes or checks what its process was given.
_TESTS = """
import json
import os
import subprocess
import sys

import pytest


def test_environment():
    child = subprocess.run(
        [sys.executable, "-c", "import sys; print('torch_overlay' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    seen = {k: os.environ.get(k) for k in ("TORCH_OVERLAY", "TORCH_OVERLAY_DISABLE", "TMPDIR",
                                           "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH", "EXTRA")}
    seen["child_imported_the_overlay"] = child.stdout.strip() == "True"
    with open(os.environ["SEEN"], "w") as f:
        json.dump(seen, f)


def test_fails():
    assert 1 == 2, "one is not two"


@pytest.fixture
def broken():
    raise RuntimeError("setup broke")


def test_errors(broken):
    pass


def test_skips():
    pytest.skip("needs a GPU")


class TestOverlay:
    def test_on(self):
        assert os.environ["TORCH_OVERLAY"] == "1"
"""


@pytest.fixture
def test_file(tmp_path: Path) -> Path:
    path = tmp_path / "tests" / "test_sides.py"
    path.parent.mkdir()
    path.write_text(_TESTS, encoding="utf-8")
    return path


def test_a_side_runs_with_its_environment_and_reads_each_outcome(
    test_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = tmp_path / "seen.json"
    monkeypatch.setenv("TORCH_OVERLAY_DISABLE", "some-fix")  # dropped: a side is the whole overlay or none
    runner = PytestRunner()
    for overlay in (False, True):
        scratch = tmp_path / f"scratch-{overlay}"
        lines: list[str] = []
        run = runner.run(
            ["-q", test_file.name],
            overlay=overlay,
            scratch=scratch,
            cwd=test_file.parent,
            extra_env={"SEEN": str(seen), "EXTRA": "x"},
            on_line=lines.append,
        )
        assert run.reported and not run.timed_out and run.returncode == 1, run.tail
        states = {test: case.state for test, case in run.cases.items()}
        assert states == {
            "test_sides::test_environment": "pass",
            "test_sides::test_fails": "fail",
            "test_sides::test_errors": "error",
            "test_sides::test_skips": "skipped",
            "test_sides.TestOverlay::test_on": "pass" if overlay else "fail",
        }
        assert "one is not two" in run.cases["test_sides::test_fails"].message
        assert "RuntimeError: setup broke" in run.cases["test_sides::test_errors"].text
        assert run.cases["test_sides::test_skips"].message == "needs a GPU"
        assert any("failed" in line for line in lines) and run.last_line == lines[-1].rstrip()
        env = json.loads(seen.read_text(encoding="utf-8"))
        assert env["TORCH_OVERLAY"] == ("1" if overlay else "0") and env["TORCH_OVERLAY_DISABLE"] is None
        assert env["TMPDIR"] == str(scratch / "tmp") and env["TORCHINDUCTOR_CACHE_DIR"] == str(scratch / "inductor")
        path = env["PYTHONPATH"].split(os.pathsep)
        # The bootstrap first (a child Python imports the overlay), the tests' folder, the checkout.
        assert path[:2] == [str(BOOTSTRAP), str(test_file.parent)] and str(REPO) in path
        assert env["child_imported_the_overlay"] and env["EXTRA"] == "x"


def test_user_switches_can_be_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_OVERLAY_STRICT", "1")
    assert side_env(False, tmp_path)["TORCH_OVERLAY_STRICT"] == "1"
    env = side_env(False, tmp_path, user_switches=False, extra={"TORCH_OVERLAY_CACHE_DIR": "/c"})
    assert "TORCH_OVERLAY_STRICT" not in env
    assert (env["TORCH_OVERLAY"], env["TORCH_OVERLAY_CACHE_DIR"]) == ("0", "/c")


def test_junit_states_messages_and_seconds(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="m.C" name="test_pass" time="12.5"/>'
        '<testcase classname="m.C" name="test_fail" time="1"><failure message="AssertionError: no">E  long'
        "</failure></testcase>"
        '<testcase classname="m" name="test_error" time="0.5"><error message="bad fixture"/></testcase>'
        '<testcase classname="m" name="test_skip"><skipped message="needs a GPU"/></testcase>'
        # pytest writes a test that failed and then errored in its teardown twice: its failure counts
        '<testcase classname="m" name="test_twice" time="1"><failure message="first"/></testcase>'
        '<testcase classname="m" name="test_twice" time="2"><error message="teardown"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    assert read_junit(report) == {
        "m.C::test_pass": CaseResult("pass", seconds=12.5),
        "m.C::test_fail": CaseResult("fail", "AssertionError: no", "E  long", 1.0),
        "m::test_error": CaseResult("error", "bad fixture", "", 0.5),
        "m::test_skip": CaseResult("skipped", "needs a GPU", "", 0.0),
        "m::test_twice": CaseResult("fail", "first", "", 3.0),
    }


_HANGS = """
import subprocess
import sys
import time


def test_spawns_a_child_and_hangs():
    # Like a rank of a multi-process test: its pid goes where the test can find it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
    print("waiting for the child", flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Whether ``pid`` ends within a few seconds of its SIGKILL (a zombie not yet reaped counts as ended)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _child_pid(folder: Path) -> int:
    """The pid the hanging test wrote, once it has written it."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = (folder / "child.pid").read_text() if (folder / "child.pid").is_file() else ""
        if text:
            return int(text)
        time.sleep(0.1)
    raise AssertionError("the test wrote no child.pid")


def _hanging_test(tmp_path: Path) -> Path:
    path = tmp_path / "test_hangs.py"
    path.write_text(_HANGS, encoding="utf-8")
    return path


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    path = _hanging_test(tmp_path)
    run = PytestRunner().run(["-s", path.name], overlay=False, scratch=tmp_path / "s", cwd=tmp_path, timeout=10)
    assert run.timed_out and not run.reported and run.cases == {}
    assert run.last_line.endswith("waiting for the child")
    assert _gone(_child_pid(tmp_path))


def test_kill_all_ends_a_run_from_another_thread(tmp_path: Path) -> None:
    path = _hanging_test(tmp_path)
    runner = PytestRunner()
    runs = []
    thread = threading.Thread(
        target=lambda: runs.append(runner.run(["-s", path.name], overlay=True, scratch=tmp_path / "s", cwd=tmp_path))
    )
    thread.start()
    child = _child_pid(tmp_path)
    runner.kill_all()
    thread.join(60)
    assert not thread.is_alive() and runs and not runs[0].timed_out and runs[0].returncode < 0
    assert _gone(child)


_ESCAPES = """
import subprocess
import sys


def test_leaves_a_child_in_a_session_of_its_own():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
"""


def test_a_child_out_of_the_group_holding_the_output_does_not_hold_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "test_escapes.py").write_text(_ESCAPES, encoding="utf-8")
    monkeypatch.setattr("torch_overlay.cli.pytest_runner._DRAIN_S", 1.0)
    try:
        run = PytestRunner().run(["-q", "-s", "test_escapes.py"], overlay=False, scratch=tmp_path / "s", cwd=tmp_path)
        assert run.reported and run.returncode == 0 and not run.timed_out
        assert [(t, c.state) for t, c in run.cases.items()] == [
            ("test_escapes::test_leaves_a_child_in_a_session_of_its_own", "pass")
        ]
    finally:
        os.kill(_child_pid(tmp_path), signal.SIGKILL)
