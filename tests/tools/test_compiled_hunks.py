"""C++ hunks: a source checkout takes them like any other hunk; an installed torch cannot.

``apply`` and ``stage`` change a ``torch/csrc`` file of a stand-in checkout; ``wheel`` (and the
runtime, tests/engine/test_compiled_hunks.py) leave it out and say that a source build carries it.
"""

from __future__ import annotations

import difflib
import re

import pytest

from tests.tools._standin import add_synthetic_patch, compiled_sources, copy_series, git, PATCHES, running_release
from torch_overlay._state import PatchState
from torch_overlay.series.hunks import apply_file_diff
from torch_overlay.series.plan import load_series, plan_series

CPP = "torch/csrc/overlay_standin.cpp"
BEFORE = "static PyObject* pack(py::tuple t) {\n  return PyTuple_Pack(1, t.release().ptr());\n}\n"
AFTER = BEFORE.replace("t.release().ptr()", "t.ptr()")


@pytest.fixture
def cpp_checkout(checkout, tmp_path):
    """A stand-in with a C++ file committed, and a series of one patch that changes only it."""
    src = checkout(running_release())
    (src / CPP).parent.mkdir(parents=True, exist_ok=True)
    (src / CPP).write_text(BEFORE)
    git(src, "add", CPP)
    git(src, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "a C++ file")
    patches = copy_series(tmp_path / "series", ids=[])
    add_synthetic_patch(patches, "cpp-pack-leak", CPP, BEFORE, AFTER)
    return src, patches


def test_apply_check_apply_and_reverse_take_a_cpp_hunk(cpp_checkout, build_cli):
    src, patches = cpp_checkout
    rc, out, err = build_cli("apply", src, "--check", "--patches", patches)
    assert rc == 0, err
    assert re.search(rf"^\s+would apply\s+cpp-pack-leak\s.*{re.escape(CPP)}", out, re.M), out
    assert (src / CPP).read_text() == BEFORE
    rc, out, err = build_cli("apply", src, "--patches", patches)
    assert rc == 0, err
    assert (src / CPP).read_text() == AFTER
    rc, out, err = build_cli("apply", src, "--reverse", "--patches", patches)
    assert rc == 0, err
    assert (src / CPP).read_text() == BEFORE


def test_stage_commits_a_cpp_hunk(cpp_checkout, build_cli):
    src, patches = cpp_checkout
    start = git(src, "rev-parse", "HEAD").strip()
    rc, out, err = build_cli("stage", src, "--patches", patches)
    assert rc == 0, err
    (commit,) = git(src, "rev-list", f"{start}..HEAD").split()
    files = git(src, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
    assert CPP in files
    assert git(src, "show", f"{commit}:{CPP}") == AFTER


def test_an_installed_torch_leaves_cpp_hunks_to_a_source_build(cpp_checkout):
    src, patches = cpp_checkout
    series = load_series(patches)
    read = lambda path: (src / path).read_text() if (src / path).is_file() else None  # noqa: E731
    (step,) = plan_series(series, "2.13.0", read, python_only=True).steps
    assert step.state == PatchState.SOURCE_ONLY
    assert CPP in step.reason and "source build" in step.reason
    (step,) = plan_series(series, "2.13.0", read).steps
    assert step.state == PatchState.APPLIED


def test_a_patch_with_both_kinds_gives_an_installed_torch_its_python_part(checkout, tmp_path):
    src = checkout(running_release())
    py_path, py_before = "torch/overlay_standin.py", "def key(t):\n    return pack(t)\n"
    (src / CPP).parent.mkdir(parents=True, exist_ok=True)
    (src / CPP).write_text(BEFORE)
    (src / py_path).write_text(py_before)
    patches = copy_series(tmp_path / "series", ids=[])
    mixed = add_synthetic_patch(patches, "mixed-fix", CPP, BEFORE, AFTER)
    py_diff = "".join(
        difflib.unified_diff(
            py_before.splitlines(True),
            py_before.replace("pack(t)", "tuple(t)").splitlines(True),
            f"a/{py_path}",
            f"b/{py_path}",
        )
    )
    text = mixed.read_text().replace("-- \n2.39.5\n", f"diff --git a/{py_path} b/{py_path}\n{py_diff}-- \n2.39.5\n")
    mixed.write_text(text)
    series = load_series(patches)
    read = lambda path: (src / path).read_text() if (src / path).is_file() else None  # noqa: E731
    plan = plan_series(series, "2.13.0", read, python_only=True)
    (step,) = plan.steps
    assert step.state == PatchState.APPLIED and "C++ hunks need a source build" in step.reason
    assert plan.changed == [py_path]
    plan = plan_series(series, "2.13.0", read)
    assert plan.steps[0].state == PatchState.APPLIED and sorted(plan.changed) == sorted([CPP, py_path])


@pytest.mark.parametrize("release, index", [("2.11.0", 0), ("2.12.1", 1)])
def test_the_stand_in_rebuilds_the_cpp_file_of_the_shipped_leak_fix(release, index):
    """0018 carries the C++ fix beside the Python mitigation; a wheel has no C++ to build a stand-in from."""
    (patch,) = [p for p in load_series(PATCHES) if p.id == "dtensor-opschema-key-leak"]
    variant = patch.variants[index]
    assert variant.python_paths and len(variant.python_paths) < len(variant.paths)
    sources = compiled_sources(release)
    (diff,) = [d for d in variant.files if not d.path.endswith(".py")]
    fixed = apply_file_diff(sources[diff.path], diff)
    assert "args_to_hash_tup.release().ptr()" in sources[diff.path]
    assert "args_to_hash_tup.release().ptr()" not in fixed and "args_to_hash_tup.ptr()" in fixed
