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
from torch_overlay.tools._plan import load_series, plan_series, series_hash
from torch_overlay.tools._testfile import merge_test, reproducer_names, strip_plumbing

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
        repo_test = (REPO / _field(step, "Test")).read_text()
        select = _field(step, "Test-Select") or " or ".join(reproducer_names(repo_test))
        command = f"python {upstream_test} -k {shlex.quote(select)}"
        assert f"Test Plan:\n{command}" in body
        assert git(src, "log", "-1", "--format=%an <%ae>|%cn <%ce>", commit).strip() == (
            "torch_overlay <torch-overlay@users.noreply.github.com>|"
            "torch_overlay <torch-overlay@users.noreply.github.com>"
        )
        staged = git(src, "show", f"{commit}:{upstream_test}")
        assert "torch_overlay" not in staged
        pr = co.git_dir() / "torch-overlay" / branch.replace("/", "-") / f"{step.patch.id}.md"
        assert pr.read_text().startswith(f"# {title}\n") and command in pr.read_text()
        # Upstream reads neither about this project nor its test layout.
        for text in (message, pr.read_text()):
            leaks = re.findall(r"overlay|tests/fixes|\bvariants?\b", text, re.I)
            assert not leaks, f"{step.patch.id}: staged text names {leaks}"
    # The staged source is what `apply` writes, and a new upstream test is the repo test minus plumbing.
    for path, text in plan.after.items():
        assert git(src, "show", f"HEAD:{path}") == text
    first = plan.applying[0]
    if not _exists(src, start, _field(first, "Upstream-Test")):
        assert git(src, "show", f"{commits[0]}:{_field(first, 'Upstream-Test')}") == strip_plumbing(
            (REPO / _field(first, "Test")).read_text()
        )


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
