"""``python -m torch_overlay verify``: quick and full reproducers, skips, ``--needed``, progress.

Each case is a throw-away series against an installed torch file (``torch/__future__.py``) with
its own small tests, run through the CLI as a user would.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

from torch_overlay.series.versions import torch_root

REPO = Path(__file__).resolve().parents[2]
TARGET = "torch/__future__.py"
NEEDLE = "    return _overwrite_module_params_on_conversion\n"
TESTS = """\
import pytest

import torch_overlay  # noqa: F401  # torch_overlay: plumbing


class TestFuture:
    def test_flag(self):
        import torch

        assert torch.__future__.get_overwrite_module_params_on_conversion() is True

    def test_fine(self):
        pass


class TestGpu:
    def test_needs_a_gpu(self):
        pytest.skip("needs a GPU")
"""


def _patch(pid: str, old: str, new: str, **fields: str) -> str:
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{TARGET}", f"b/{TARGET}"))
    extra = "".join(f"{k.replace('_', '-')}: {v}\n" for k, v in fields.items())
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"Subject: [PATCH] {pid}\n\nOverlay-Id: {pid}\n{extra}\nTest fixture.\n---\n"
        f"diff --git a/{TARGET} b/{TARGET}\n{diff}-- \n2.39.5\n"
    )


def _series(tmp_path: Path, **patches: dict[str, str]) -> Path:
    """``patches``: id -> fields; each patch makes the flag function return True."""
    old = (torch_root() / TARGET).read_text()
    assert NEEDLE in old
    new = old.replace(NEEDLE, "    return True\n", 1)
    folder = tmp_path / "patches"
    folder.mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_future.py").write_text(TESTS)
    names = []
    for n, (pid, fields) in enumerate(patches.items(), 1):
        reverse = fields.pop("reverse", "")  # a patch this torch already has: the upstream state
        text = _patch(pid, new, old, **fields) if reverse else _patch(pid, old, new, **fields)
        names.append(f"{n:04d}-{pid}.patch")
        (folder / names[-1]).write_text(text)
    (folder / "series").write_text("\n".join(names) + "\n")
    return folder


def _verify(tmp_path: Path, *args: str) -> tuple[int, dict[str, dict[str, object]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(
        PYTHONPATH=str(REPO), TORCH_OVERLAY_PATCHES=str(tmp_path / "patches"), XDG_CACHE_HOME=str(tmp_path / "cache")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "verify", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    verdicts = {v["id"]: v for v in json.loads(proc.stdout)["verdicts"]} if proc.stdout.strip() else {}
    return proc.returncode, verdicts, proc.stderr


def test_a_fix_whose_tests_were_all_skipped_could_not_run_here(tmp_path):
    _series(tmp_path, gpu={"Test": "tests/test_future.py", "Test_Select": "TestGpu"})
    rc, verdicts, err = _verify(tmp_path)
    assert verdicts["gpu"]["without_overlay"] == verdicts["gpu"]["with_overlay"] == "skipped", err
    assert verdicts["gpu"]["verdict"] == "could not run here: every test was skipped (needs a GPU)"
    assert verdicts["gpu"]["kind"] == "all-skipped"
    assert rc == 0  # reported, not failed


def test_quick_runs_one_test_per_fix_in_one_process_each_way(tmp_path):
    _series(
        tmp_path,
        flag={
            "Test": "tests/test_future.py",
            "Quick_Test": "tests/test_future.py::TestFuture::test_flag",
            "Symptom": "the flag is off",
        },
        fine={"Test": "tests/test_future.py", "Quick_Test": "tests/test_future.py::TestFuture::test_fine"},
    )
    rc, verdicts, err = _verify(tmp_path, "--quick", "-j", "2")
    assert rc == 0, err
    assert "2 pytest runs for 2 fixes" in err
    assert (verdicts["flag"]["without_overlay"], verdicts["flag"]["with_overlay"]) == ("fail", "pass")
    assert verdicts["flag"]["verdict"] == "bug present without, fixed with the overlay"
    assert verdicts["flag"]["symptom"] == "the flag is off"
    assert "AssertionError" in verdicts["flag"]["details"]["without"]
    assert verdicts["fine"]["verdict"].startswith("not needed")
    assert (verdicts["flag"]["kind"], verdicts["fine"]["kind"]) == ("fixed", "not-needed")
    # Progress: each test as it ends, then each fix's verdict; the next run knows how long it takes.
    assert "flag without the overlay: fail" in err and "flag: bug present without" in err
    assert (tmp_path / "cache" / "torch_overlay" / "verify-times.json").is_file()
    _, _, err = _verify(tmp_path, "--quick", "-j", "2")
    assert "the last run took ~" in err


def test_full_runs_each_file_and_needed_skips_what_torch_has(tmp_path):
    _series(
        tmp_path,
        had={"Test": "tests/test_future.py", "Test_Select": "TestFuture", "reverse": "1"},
        flag={"Test": "tests/test_future.py", "Test_Select": "TestFuture"},
    )
    rc, verdicts, err = _verify(tmp_path, "--needed", "-j", "1")
    assert rc == 0, err
    assert list(verdicts) == ["flag"]
    assert verdicts["flag"]["verdict"] == "bug present without, fixed with the overlay"
    assert "2 pytest runs for 1 fixes, 1 at a time" in err


def test_needed_plans_a_chosen_fix_on_top_of_the_earlier_fixes(tmp_path):
    # `after` changes the line `flag` wrote: alone against torch's file it does not apply.
    folder = _series(tmp_path, flag={"Test": "tests/test_future.py", "Test_Select": "TestFuture"})
    patched = (torch_root() / TARGET).read_text().replace(NEEDLE, "    return True\n", 1)
    after = _patch(
        "after",
        patched,
        patched.replace("    return True\n", "    return bool(1)\n", 1),
        Test="tests/test_future.py",
        Test_Select="TestFuture",
    )
    (folder / "0002-after.patch").write_text(after)
    (folder / "series").write_text("0001-flag.patch\n0002-after.patch\n")
    rc, verdicts, err = _verify(tmp_path, "--needed", "-j", "1", "after")
    assert rc == 0, err
    assert list(verdicts) == ["after"]
    assert verdicts["after"]["verdict"] == "bug present without, fixed with the overlay"


def test_a_failing_subtest_fails_its_test_in_the_progress_and_the_verdict(tmp_path):
    # Two quick tests share one process each way: the progress then comes from each test's line.
    folder = _series(
        tmp_path,
        flag={"Test": "tests/test_future.py", "Quick_Test": "tests/test_sub.py::TestSub::test_cases"},
        fine={"Test": "tests/test_future.py", "Quick_Test": "tests/test_future.py::TestFuture::test_fine"},
    )
    (tmp_path / "tests" / "test_sub.py").write_text(
        "import unittest\n\nimport torch_overlay  # noqa: F401\n\n\n"
        "class TestSub(unittest.TestCase):\n"
        "    def test_cases(self):\n"
        "        import torch\n\n"
        "        for case in range(2):\n"
        "            with self.subTest(case=case):\n"
        "                self.assertTrue(torch.__future__.get_overwrite_module_params_on_conversion())\n"
    )
    assert folder.is_dir()
    rc, verdicts, err = _verify(tmp_path, "--quick", "-j", "2")
    assert rc == 0, err
    assert verdicts["flag"]["verdict"] == "bug present without, fixed with the overlay"
    assert "flag without the overlay: fail" in err and "flag with the overlay: pass" in err
    assert "flag: not needed" not in err


def test_an_unknown_id_is_an_error_naming_the_known_ones(tmp_path):
    _series(tmp_path, flag={"Test": "tests/test_future.py", "Test_Select": "TestFuture"})
    rc, verdicts, err = _verify(tmp_path, "no-such-id")
    assert rc == 2 and verdicts == {}
    assert "unknown patch id(s) no-such-id; known: flag" in err


def test_without_tests_verify_says_it_runs_from_a_checkout(tmp_path):
    _series(tmp_path, flag={"Test": "tests/test_future.py", "Test_Select": "TestFuture"})
    for f in (tmp_path / "tests").iterdir():
        f.unlink()
    (tmp_path / "tests").rmdir()
    rc, verdicts, err = _verify(tmp_path)
    assert rc == 2 and verdicts == {}
    assert err.count("runs from a source checkout") == 1, err
