"""``build.sh compare``: a test file without and with the overlay, and what changed."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_overlay.tools import compare as compare_module
from torch_overlay.tools.compare import Difference, Slowdown, compare, run_compare, slowdowns

ROOT = Path(__file__).resolve().parents[2]

# No torch: each test reads which side it runs on.
_TESTS = """
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


def test_broken_either_way():
    assert False
"""


@pytest.fixture
def test_file(tmp_path: Path) -> Path:
    path = tmp_path / "test_upstream_like.py"
    path.write_text(_TESTS, encoding="utf-8")
    return path


def test_lists_what_changed_and_fails_on_a_regression(test_file: Path) -> None:
    out = io.StringIO()
    assert run_compare(test_file, out=out) == 1
    text = out.getvalue()
    assert "without the overlay: 3 pass, 2 fail, 0 error, 0 skipped" in text
    assert "with the overlay: 3 pass, 2 fail, 0 error, 0 skipped" in text
    assert "REGRESSION test_upstream_like::test_broken_by_the_overlay: pass -> fail" in text
    assert "  test_upstream_like::test_fixed_by_the_overlay: fail -> pass" in text
    assert "test_same" not in text and "launcher" not in text
    # a test that fails either way is named, apart from the differences
    assert "failing without and with the overlay (1):\n  test_upstream_like::test_broken_either_way: fail\n" in text


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
    assert (
        textwrap.dedent("""\
        1 test(s) change outcome (without -> with):
          test_upstream_like::test_fixed_by_the_overlay: fail -> pass
        """)
        in proc.stdout
    )


def test_options_after_the_file_and_pytest_args_after_dashes(test_file: Path) -> None:
    # As the README writes it: `compare TEST_FILE --timeout S -- PYTEST ARGS`.
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay.tools", "compare", str(test_file)]
        + ["--timeout", "120", "--", "-k", "same"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no test of test_upstream_like.py changes outcome with the overlay (1 tests)" in proc.stdout


_HANGS = """
import subprocess
import sys
import time


def test_spawns_a_child_and_hangs():
    # Like a rank of a multi-process test: its pid goes where the test can find it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
    print("waiting for the child")
    time.sleep(600)
"""


def test_a_timeout_ends_the_spawned_processes_and_shows_pytests_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "test_hangs.py"
    path.write_text(_HANGS, encoding="utf-8")
    out = io.StringIO()
    # The runs are unbuffered (side_env): with PYTHONUNBUFFERED unset in the caller's environment,
    # the print sat in pytest's buffer when the run was killed.
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    assert run_compare(path, ["-s"], timeout=15, out=out) == 2
    text = out.getvalue()
    assert "the run without the overlay wrote no report (timed out or crashed)" in text
    assert "waiting for the child" in text and "killed after 15 s" in text
    pid = int((tmp_path / "child.pid").read_text())
    # The child was killed with the test's process group; only a zombie may remain.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), state


def test_slowdowns_need_both_the_ratio_and_the_seconds() -> None:
    without = {"fast": 0.01, "long": 100.0, "slow": 10.0, "zero": 0.0}
    with_ = {"fast": 0.5, "long": 110.0, "slow": 16.0, "zero": 6.0, "new": 50.0}
    found = slowdowns(without, with_)
    assert found == [Slowdown("slow", 10.0, 16.0), Slowdown("zero", 0.0, 6.0)]
    assert found[0].ratio == pytest.approx(1.6) and found[1].ratio == float("inf")
    assert slowdowns(without, with_, ratio=1.05, seconds=1.0) == [
        Slowdown("long", 100.0, 110.0),
        Slowdown("slow", 10.0, 16.0),
        Slowdown("zero", 0.0, 6.0),
    ]


_SLOWER = """
import os
import time


def test_slower_with_the_overlay():
    # 0.1 s without: a JUnit time of 0.000 (a fast machine) would make the ratio infinite
    time.sleep(1.5 if os.environ["TORCH_OVERLAY"] == "1" else 0.1)


def test_quick():
    pass
"""


def test_lists_times_and_flags_a_slowdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "test_slower.py"
    path.write_text(_SLOWER, encoding="utf-8")
    # the real thresholds (5 s) would make this test slow
    monkeypatch.setattr(compare_module, "SLOWDOWN_SECONDS", 1.0)
    out = io.StringIO()
    assert run_compare(path, out=out, reach=False) == 0  # a slowdown is a finding, not a failure
    text = out.getvalue()
    assert "time of the tests that pass both ways (without -> with, ratio):\n" in text
    line = r"\n  SLOWDOWN test_slower::test_slower_with_the_overlay: 0\.\d s -> 1\.\d s \(x\d+\.\d\d\)\n"
    assert re.search(line, text), text
    assert "(1 test(s) under 1 s either way not listed)" in text
    assert "1 test(s) slower with the overlay (over x1.2 and 1 s more;" in text
    assert "no test of test_slower.py changes outcome with the overlay (2 tests)" in text
    assert "reach" not in text


# A DTensor op under a fake process group (its sharding propagation runs the new_factory_strategy that
# dtensor-new-factory-shard-partial changes), in the test's process and in a child; a test without it.
_REACHES = '''
import subprocess
import sys

import torch


def test_plain_tensors():
    assert (torch.ones(2) + 1).sum() == 4


NEW_ONES = """
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
assert x.new_ones((4, 4)).to_local().shape == (4, 4)
dist.destroy_process_group()
"""


def test_dtensor_new_ones():
    exec(NEW_ONES, {})


def test_dtensor_new_ones_in_a_child():  # like a rank of a multi-process test
    subprocess.run([sys.executable, "-c", NEW_ONES], check=True)
'''


def test_reach_counts_the_tests_that_ran_a_fixs_changed_code(tmp_path: Path) -> None:
    path = tmp_path / "test_reaches.py"
    path.write_text(_REACHES, encoding="utf-8")
    out = io.StringIO()
    assert run_compare(path, out=out) == 0
    text = out.getvalue()
    assert "reach: tests (of 3) that ran a fix's changed functions, with the overlay:\n" in text, text
    if "dtensor-new-factory-shard-partial" not in text:
        pytest.skip("dtensor-new-factory-shard-partial does not apply to this torch")
    # The test that runs the op and the one whose child does (its count is written at the child's exit).
    assert re.search(r"\n  dtensor-new-factory-shard-partial: 2 test\(s\), \d+ call\(s\)\n", text), text
    # A fix applied in that process (torch imports torch.nn.utils) that no test called.
    idle = re.search(r"\n  applied, reached by no test \(\d+\): (.*)\n", text)
    assert idle and "clip-grad-norm-mixed-meshes" in idle.group(1).split(", "), text


def test_json_holds_the_comparison_and_reach_is_counted_in_a_run_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "test_reaches.py"
    path.write_text(_REACHES, encoding="utf-8")
    result = tmp_path / "result.json"
    arms, run = [], compare_module._run

    def recorded(test_file, pytest_args, overlay, folder, timeout, reach=True):
        arms.append((overlay, reach))
        return run(test_file, pytest_args, overlay, folder, timeout, reach)

    monkeypatch.setattr(compare_module, "_run", recorded)
    out = io.StringIO()
    assert run_compare(path, out=out, json_out=result) == 0
    # On 3.11 reach's counter changes the changed functions' code: it counts in a third run, not the compared one.
    assert arms == (
        [(False, False), (True, False), (True, True)] if sys.version_info < (3, 12) else [(False, False), (True, True)]
    )
    data = json.loads(result.read_text(encoding="utf-8"))
    assert data["without"] == data["with"] and sum(data["with"].values()) == 3
    assert data["differences"] == [] and data["slowdowns"] == []
    assert data["time_ratio"] is None or data["time_ratio"] > 0
    assert isinstance(data["uncounted"], list) and not set(data["uncounted"]) & set(data["reach"])
    if "dtensor-new-factory-shard-partial" not in data["reach"]:
        pytest.skip("dtensor-new-factory-shard-partial does not apply to this torch")
    assert data["reach"]["dtensor-new-factory-shard-partial"] == 2


# Ranks that persist across a class's tests (torch's MultiProcContinuousTest): only the middle test runs
# the DTensor op whose strategy dtensor-new-factory-shard-partial changes, in both ranks.
_PERSISTENT_RANKS = """
import torch
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from torch.testing._internal.common_distributed import MultiProcContinuousTest
from torch.testing._internal.common_utils import run_tests


class PersistentRanksTest(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    @classmethod
    def device_type(cls) -> str:
        return "cpu"

    def test_a_plain(self):
        assert (torch.ones(2) + 1).sum() == 4

    def test_b_dtensor_new_ones(self):
        x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
        assert x.new_ones((4, 4)).ndim == 2

    def test_c_plain(self):
        assert (torch.ones(2) * 2).sum() == 4


if __name__ == "__main__":
    run_tests()
"""


def test_reach_of_ranks_that_persist_across_tests_goes_to_the_test_they_ran(tmp_path: Path) -> None:
    # Each rank dumps its counts after each test it runs, named by the test (engine/reach_ranks.py);
    # written only at exit, they came after the plugin had read the first test's folder: reach 0.
    path = tmp_path / "test_persistent_ranks.py"
    path.write_text(_PERSISTENT_RANKS, encoding="utf-8")
    result = tmp_path / "result.json"
    out = io.StringIO()
    assert run_compare(path, out=out, json_out=result, timeout=600) == 0, out.getvalue()
    data = json.loads(result.read_text(encoding="utf-8"))
    assert data["without"] == data["with"] and data["with"]["pass"] == 3, out.getvalue()
    if "dtensor-new-factory-shard-partial" not in data["reach"]:
        pytest.skip("dtensor-new-factory-shard-partial does not apply to this torch")
    assert data["reach"]["dtensor-new-factory-shard-partial"] == 1, out.getvalue()
    # What each rank calls while it imports torch and the test module is not counted.
    assert set(data["reach"].values()) <= {0, 1}, data["reach"]
