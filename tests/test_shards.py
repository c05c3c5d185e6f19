"""Several pytest processes sharing one suite run (tests/_shards.py, ``TORCH_OVERLAY_TEST_JOBS``): every
test runs exactly once, and each class's and module's fixtures are set up and torn down in pairs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUITE = """
import os
import time

import pytest

LOG = os.environ["SHARD_LOG"]


def note(what):
    with open(LOG, "a") as f:
        f.write(f"{what} {os.getpid()}\\n")


@pytest.fixture(scope="module")
def mod():
    note("setup " + __name__)
    yield
    note("teardown " + __name__)


class TestA:
    @pytest.fixture(scope="class", autouse=True)
    def per_class(self, request):
        note("setup " + __name__ + ".A")
        yield
        note("teardown " + __name__ + ".A")

    @pytest.mark.parametrize("n", range(3))
    def test_a(self, mod, n):
        time.sleep(0.2)  # long enough for both processes to have started


class TestB:
    def test_b(self, mod):
        pass


def test_f(mod):
    time.sleep(0.2)


def test_g():
    # A pytest this test would start runs all of its own tests, not what is left to claim.
    assert "TORCH_OVERLAY_TEST_CLAIMS" not in os.environ
"""


def _run(tmp_path: Path, jobs: int) -> tuple[list[str], list[str]]:
    """Run the suite in ``jobs`` processes sharing one claims folder; (passed node ids, fixture log)."""
    claims, log = tmp_path / "claims", tmp_path / "log"
    claims.mkdir()
    env = dict(os.environ, TORCH_OVERLAY_TEST_CLAIMS=str(claims), SHARD_LOG=str(log), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests._shards", "-rA", "-q"]
    cmd += [f"test_m{i}.py" for i in range(4)]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(jobs)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    passed = [m for out in outs for m in re.findall(r"^PASSED (\S+)", out, re.M)]
    return passed, log.read_text().splitlines()


def test_two_processes_run_every_test_once_with_fixtures_in_pairs(tmp_path):
    for i in range(4):
        (tmp_path / f"test_m{i}.py").write_text(SUITE)
    passed, log = _run(tmp_path, jobs=2)
    assert sorted(passed) == sorted(
        f"test_m{i}.py::{test}"
        for i in range(4)
        for test in ("TestA::test_a[0]", "TestA::test_a[1]", "TestA::test_a[2]", "TestB::test_b", "test_f", "test_g")
    )
    assert len(set(passed)) == len(passed) == 24
    # Every setup has its teardown in the same process; a class's fixture is set up once.
    events = Counter(tuple(line.split()) for line in log)  # (setup|teardown, name, pid)
    for (what, name, pid), count in events.items():
        if what == "setup":
            assert events[("teardown", name, pid)] == count, log
    assert sum(count for (what, name, _), count in events.items() if what == "setup" and name.endswith(".A")) == 4
    # Both processes took work.
    assert len({line.split()[-1] for line in log}) == 2, log
