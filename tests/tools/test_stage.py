"""``build.sh stage``: upstream commits, test placement, messages and PR bodies on stand-ins."""

from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path

import pytest

from tests.tools._standin import (
    add_synthetic_patch,
    copy_series,
    git,
    PATCHES,
    REPO,
    running_release,
    versions_under_test,
)
from torch_overlay.tools import BuildError
from torch_overlay.tools._checkout import open_checkout
from torch_overlay.series.plan import load_series, plan_series, series_hash
from torch_overlay.cli.verify import selected_classes
from torch_overlay.tools._testfile import fix_test, merge_test, reproducer_names, resolve_gates, strip_plumbing

VERSIONS = versions_under_test()


@pytest.fixture
def no_git_identity(tmp_path, monkeypatch):
    """Like CI: no git identity anywhere; HOME and the working folder must stay empty."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(cwd)
    yield
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == [], "stage wrote outside the checkout"


def _field(step, name: str) -> str:
    return step.variant.fields.get(name) or step.patch.main.fields.get(name, "")


@pytest.mark.parametrize("release", VERSIONS)
def test_stage_one_commit_per_patch(release, checkout, build_cli, no_git_identity):
    src = checkout(release)
    co = open_checkout(src)
    patches = load_series(PATCHES)
    plan = plan_series(patches, co.version, co.head_text)
    start = git(src, "rev-parse", "HEAD").strip()
    rc, out, err = build_cli("stage", src, "--patches", PATCHES)
    if plan.drifted:
        assert rc == 1 and "drift" in err and git(src, "rev-parse", "HEAD").strip() == start
        return
    assert rc == 0, err
    if not plan.applying:
        assert "nothing to stage" in out and git(src, "branch", "--list", "torch-overlay/*") == ""
        return

    branch = f"torch-overlay/{series_hash(patches)}"
    assert git(src, "symbolic-ref", "--short", "HEAD").strip() == branch
    commits = git(src, "rev-list", "--reverse", f"{start}..HEAD").split()
    assert len(commits) == len(plan.applying)
    assert git(src, "status", "--porcelain", "--untracked-files=all") == ""
    for commit, step in zip(commits, plan.applying, strict=True):
        upstream_test = _field(step, "Upstream-Test")
        files = git(src, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
        guard_test = _field(step, "Upstream-Guard-Test")
        assert sorted(files) == sorted(set(step.paths) | {upstream_test} | ({guard_test} if guard_test else set()))
        message = git(src, "log", "-1", "--format=%B", commit)
        title, _, body = message.partition("\n\n")
        assert title == step.variant.title and not title.startswith("[PATCH")
        assert step.variant.description.split("\n")[0] in body
        for bug in _field(step, "Bug").split(","):
            if "github.com/pytorch/pytorch/issues/" in bug:
                assert f"Fixes #{bug.strip().rstrip('/').rsplit('/', 1)[1]}" in body
        classes = selected_classes(_field(step, "Test-Select"))
        assert classes, f"{step.patch.id}: no Test-Select"
        command = f"python {upstream_test} -k {shlex.quote(' or '.join(classes))}"
        assert f"Test Plan:\n{command}" in body
        assert git(src, "log", "-1", "--format=%an <%ae>|%cn <%ce>", commit).strip() == (
            "torch_overlay <torch-overlay@users.noreply.github.com>|"
            "torch_overlay <torch-overlay@users.noreply.github.com>"
        )
        staged = git(src, "show", f"{commit}:{upstream_test}")
        assert "torch_overlay" not in staged and "_torch_gates" not in staged
        compile(staged, upstream_test, "exec")
        # This commit adds its own classes and none of the other fixes' classes of the module.
        parent = f"{commit}^"
        had = (
            _class_names(git(src, "show", f"{parent}:{upstream_test}"))
            if _exists(src, parent, upstream_test)
            else set()
        )
        added = _class_names(staged) - had
        assert set(classes) <= added, (step.patch.id, added)
        assert not added & other_classes(step.patch.id), (step.patch.id, added & other_classes(step.patch.id))
        pr = co.git_dir() / "torch-overlay" / branch.replace("/", "-") / f"{step.patch.id}.md"
        assert pr.read_text().startswith(f"# {title}\n") and command in pr.read_text()
        # Upstream reads neither about this project nor its test layout, nor what a job said about it.
        assert not _field(step, "Silent") or _field(step, "Silent") not in message, step.patch.id
        for text in (message, pr.read_text()):
            leaks = re.findall(r"overlay|tests/fixes|\bvariants?\b", text, re.I)
            assert not leaks, f"{step.patch.id}: staged text names {leaks}"
    # The staged source is what `apply` writes, and a new upstream test is the repo test minus plumbing.
    for path, text in plan.after.items():
        assert git(src, "show", f"HEAD:{path}") == text
    first = plan.applying[0]
    if not _exists(src, start, _field(first, "Upstream-Test")):
        assert git(src, "show", f"{commits[0]}:{_field(first, 'Upstream-Test')}") == fix_test(
            (REPO / _field(first, "Test")).read_text(), selected_classes(_field(first, "Test-Select"))
        )


def _class_names(text: str) -> set[str]:
    return {n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}


def other_classes(pid: str) -> set[str]:
    """The test classes of every other fix (their Test-Select and Guard-Test classes)."""
    out = set()
    for patch in load_series(PATCHES):
        if patch.id != pid and patch.main is not None:
            out |= set(selected_classes(patch.main.fields.get("Test-Select", "")))
            out |= set(selected_classes(patch.main.fields.get("Guard-Test", "").partition("::")[2]))
    return out


def _exists(src: Path, commit: str, path: str) -> bool:
    return path in git(src, "ls-tree", "-r", "--name-only", commit, "--", path).split()


@pytest.mark.parametrize("release", [running_release()])
def test_stage_merges_into_existing_upstream_test(release, checkout, build_cli, no_git_identity, tmp_path):
    """Two synthetic patches sharing one upstream test file that already exists upstream."""
    src = checkout(release)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/_environment.py"
    base = (src / path).read_text()
    one, two = base + "\n\n# one\n", base + "\n\n# one\n# two\n"
    # Both patches place their tests in one upstream file, which upstream already has.
    add_synthetic_patch(patches, "synthetic-one", path, base, one, bug=11, upstream_test="test/test_existing.py")
    add_synthetic_patch(patches, "synthetic-two", path, one, two, bug=22, upstream_test="test/test_existing.py")
    existing = (
        '# Owner(s): ["module: tests"]\n\nimport os\n\nfrom torch.testing._internal.common_utils import run_tests\n\n\n'
        "class ExistingTest:\n    def test_existing(self):\n        pass\n\n\n"
        'if __name__ == "__main__":\n    run_tests()\n'
    )
    (src / "test").mkdir()
    (src / "test" / "test_existing.py").write_text(existing)
    git(src, "add", "test/test_existing.py")
    git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "existing test")

    rc, out, err = build_cli("stage", src, "--patches", patches, "--branch", "overlay/merge")
    assert rc == 0, err
    merged = (src / "test" / "test_existing.py").read_text()
    tree = ast.parse(merged)
    names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert names == ["ExistingTest", "SyntheticOneTest", "SyntheticTwoTest"]
    assert merged.startswith(
        existing.split("\n\n\nclass")[0] + "\nfrom torch.testing._internal.common_utils import TestCase\n"
    )
    assert "\n\n\nclass ExistingTest:\n    def test_existing(self):\n        pass\n\n\n" in merged
    assert isinstance(tree.body[-1], ast.If) and "__main__" in ast.unparse(tree.body[-1].test)
    assert "torch_overlay" not in merged
    log = git(src, "log", "--format=%s", "-2").splitlines()
    assert log == ["[synthetic] synthetic-two", "[synthetic] synthetic-one"]
    body = git(src, "log", "-1", "--format=%b")
    assert "Fixes #22" in body and "Related: https://example.invalid/other/22" in body
    assert "python test/test_existing.py -k test_synthetic_two" in body


@pytest.mark.parametrize("release", [running_release()])
def test_stage_refusals_change_nothing(release, checkout, build_cli, no_git_identity, tmp_path):
    src = checkout(release)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/_environment.py"
    base = (src / path).read_text()
    add_synthetic_patch(patches, "synthetic-one", path, base, base + "# one\n")
    head = git(src, "rev-parse", "HEAD").strip()

    def unchanged() -> bool:
        return git(src, "rev-parse", "HEAD").strip() == head and git(
            src, "branch", "--format=%(refname:short)"
        ).split() == ["main"]

    (src / "torch" / "_VF.py").write_text("# dirty\n")
    rc, _, err = build_cli("stage", src, "--patches", patches)
    assert rc == 1 and "uncommitted changes" in err and unchanged()
    git(src, "checkout", "--", "torch/_VF.py")

    add_synthetic_patch(patches, "synthetic-drift", path, "nowhere\nin torch\n", "nowhere\n")
    rc, _, err = build_cli("stage", src, "--patches", patches)
    assert rc == 1 and "synthetic-drift" in err and unchanged()

    (patches / "series").write_text((patches / "series").read_text().split()[0] + "\n")
    (tmp_path / "repo" / "synthetic" / "test_synthetic_one.py").unlink()
    rc, _, err = build_cli("stage", src, "--patches", patches)
    assert rc == 1 and "is not a file" in err and unchanged()


def test_merge_test_refuses_name_clashes():
    existing = "import os\n\n\nclass FooTest:\n    pass\n"
    ours = "import sys\n\n\nclass FooTest:\n    def test_x(self):\n        pass\n"
    with pytest.raises(BuildError, match="already defines FooTest"):
        merge_test(existing, ours, "test/test_foo.py")
    with pytest.raises(BuildError, match="binds 'os' differently"):
        merge_test(existing, "from pathlib import os\n\n\nclass BarTest:\n    pass\n", "test/test_foo.py")


def test_merge_test_places_imports_and_future():
    existing = '"""Doc."""\nimport os\n\n\nclass A:\n    pass\n'
    ours = (
        "from __future__ import annotations\n\nimport os\nimport sys as system\n\n\n"
        "# why\nclass B:\n    def test_b(self):\n        pass\n"
    )
    merged = merge_test(existing, ours, "t.py")
    assert merged == (
        '"""Doc."""\nfrom __future__ import annotations\nimport os\nimport sys as system\n\n\nclass A:\n    pass\n'
        "\n\n# why\nclass B:\n    def test_b(self):\n        pass\n"
    )
    compile(merged, "t.py", "exec")
    assert reproducer_names(ours) == ["test_b"]
    assert strip_plumbing("a\nimport torch_overlay  # torch_overlay: plumbing\nb\n") == "a\nb\n"


# Upstream's own test files, as stand-ins: a class, helpers, imports, instantiation and main guard.
_UPSTREAM_TESTS = {
    "test/inductor/test_unbacked_symints.py": """\
# Owner(s): ["module: inductor"]

import torch
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU


def upstream_helper(x):
    return x + 1


class TestUnbackedSymints(InductorTestCase):
    def test_upstream_own(self, device):
        self.assertEqual(upstream_helper(torch.ones(1, device=device)), 2)


instantiate_device_type_tests(TestUnbackedSymints, globals(), allow_xpu=True)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
""",
    "test/distributed/tensor/test_dtensor_compile.py": """\
# Owner(s): ["oncall: distributed"]

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import run_tests


class TestDTensorCompile(torch._dynamo.test_case.TestCase):
    def test_dtensor_basic(self):
        self.assertTrue(True)


if __name__ == "__main__":
    run_tests()
""",
}


@pytest.mark.parametrize("release", [running_release()])
def test_stage_commits_only_the_fixs_class_and_what_it_uses(release, checkout, build_cli, no_git_identity, tmp_path):
    """One fix per upstream file: its class, its helpers, no other fix's class, no version gate."""
    src = checkout(release)
    wanted = ["aot-subclass-outputs-intermediate-bases", "inductor-unbacked-split-item"]
    patches = copy_series(tmp_path / "repo", ids=wanted)
    co = open_checkout(src)
    plan = plan_series(load_series(patches), co.version, co.head_text)
    if [s.patch.id for s in plan.applying] != wanted:
        pytest.skip(f"{wanted} do not both apply to torch {release}")
    for path, text in _UPSTREAM_TESTS.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    git(src, "add", "test")
    git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "upstream tests")

    rc, _, err = build_cli("stage", src, "--patches", patches, "--branch", "overlay/one-class")
    assert rc == 0, err
    for step in plan.applying:
        path = _field(step, "Upstream-Test")
        staged = (src / path).read_text()
        compile(staged, path, "exec")
        assert not re.search(r"torch_overlay|_torch_gates|\bbefore\(|for_torch|skip_before|_TORCH_2_11", staged)
        upstream = _UPSTREAM_TESTS[path]
        assert staged.startswith(upstream.split("\n\n\n")[0])  # upstream's imports first, unchanged
        assert _class_names(upstream) < _class_names(staged)  # upstream's own tests are still there
        assert _class_names(staged) - _class_names(upstream) & other_classes(step.patch.id) == set()
        assert set(selected_classes(_field(step, "Test-Select"))) <= _class_names(staged)
        assert isinstance(ast.parse(staged).body[-1], ast.If)  # upstream's main guard still last
    inductor = (src / "test/inductor/test_unbacked_symints.py").read_text()
    # The helpers of this fix come along; the module's other fixes' helpers do not.
    assert "def split_item_slice(" in inductor and "SUM_OF_SPLIT_SIZES = " in inductor
    assert "def moe(" not in inductor and "NUM_EXPERTS" not in inductor and "checkpoint" not in inductor
    assert "instantiate_device_type_tests(\n    TestInductorUnbackedSplitItem," in inductor
    dtensor = (src / "test/distributed/tensor/test_dtensor_compile.py").read_text()
    # Resolved as on the newest torch: the stride is always compared; the 2.11 remark is gone.
    assert "self.assertEqual(c.stride(), e.stride(), msg=msg)" in dtensor and "2.11" not in dtensor
    assert "def scale(" not in dtensor and "_MULTI_RANK_SCRIPT" not in dtensor and "VIEWS" not in dtensor
    assert "instantiate_parametrized_tests(TestAotSubclassOutputsIntermediateBases)" in dtensor
    body = git(src, "log", "-1", "--format=%b")
    assert "python test/inductor/test_unbacked_symints.py -k TestInductorUnbackedSplitItem" in body


_GATED = """\
import unittest

import torch
from tests.fixes._torch_gates import before, for_torch, skip_before


class TestGated(unittest.TestCase):
    @skip_before("2.12", "old")
    def test_a(self):
        if not (before("2.12") and torch.cuda.is_available()):
            self.assertTrue(True)
        if before("2.12"):
            # torch 2.11 only
            self.skipTest("old")
        else:
            x = for_torch({"2.11": "old", "2.14": \"\"\"\\
new\"\"\"})
        self.assertTrue(x)
"""


def test_resolve_gates_takes_the_newest_torchs_branch():
    staged = resolve_gates(_GATED)
    compile(staged, "t.py", "exec")
    assert not re.search(r"before|skip_before|for_torch|_torch_gates|2\.11", staged)
    assert '        self.assertTrue(True)\n        x = """\\\nnew"""\n        self.assertTrue(x)\n' in staged
    at_213 = resolve_gates(_GATED, "2.13.0")
    assert 'x = "old"' in at_213 and "2.11" not in at_213.replace('"2.11"', "")
    with pytest.raises(BuildError, match="skipped on torch 2.11"):
        resolve_gates(_GATED, "2.11.0")
    with pytest.raises(BuildError, match="decide its `if` alone"):
        resolve_gates(_GATED.replace('if not (before("2.12") and', 'if not (before("2.12") or'))
    with pytest.raises(BuildError, match="cannot resolve"):
        resolve_gates(_GATED.replace("        self.assertTrue(x)\n", "        self.assertTrue(before)\n"))


def test_select_classes_keeps_what_the_class_uses():
    text = """\
import os
import sys
from typing import Any, Callable

import torch


HELPER_CONST = 2


@torch.library.custom_op("t::op", mutates_args=())
def op(x: torch.Tensor) -> torch.Tensor:
    return x * HELPER_CONST


@op.register_fake
def _(x):
    return torch.empty_like(x)


def other_helper() -> Any:
    return sys.argv


class TestOne(torch.nn.Module):
    def test_one(self):
        op(torch.ones(1))


class TestTwo(torch.nn.Module):
    def test_two(self):
        other_helper()


TestOneCopy = type("TestOneCopy", (TestOne,), {})
print(TestTwo)
"""
    one = fix_test(text, ["TestOne"])
    compile(one, "t.py", "exec")
    assert "class TestTwo" not in one and "other_helper" not in one and "import sys" not in one
    assert "def _(x)" in one and "HELPER_CONST = 2" in one and "TestOneCopy = " in one
    assert "from typing import" not in one and "import os" not in one
    two = fix_test(text, ["TestTwo"])
    assert "from typing import Any\n" in two and "print(TestTwo)" in two and "def op(" not in two
    with pytest.raises(BuildError, match="no test class TestThree"):
        fix_test(text, ["TestThree"])
