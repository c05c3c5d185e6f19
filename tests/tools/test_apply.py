"""``build.sh apply``: check, apply, idempotence, reverse and refusals on stand-in checkouts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools._standin import (
    add_synthetic_patch,
    copy_series,
    git,
    installed_torches,
    PATCHES,
    REPO,
    versions_under_test,
)
from torch_overlay.tools._checkout import open_checkout
from torch_overlay.series.plan import load_series, Plan, plan_series

VERSIONS = versions_under_test()
WORDS = {"applied": "would apply", "upstream": "upstream", "drift": "drift", "not needed": "not needed"}


def _plan(src: Path, patches: Path = PATCHES) -> Plan:
    checkout = open_checkout(src)
    return plan_series(load_series(patches), checkout.version, checkout.head_text)


def _snapshot(src: Path) -> dict[str, str]:
    """Tracked changes and the text of every changed file: enough to see that nothing moved."""
    changed = git(src, "status", "--porcelain", "--untracked-files=all").splitlines()
    return {line: (src / line[3:]).read_text() if (src / line[3:]).is_file() else "" for line in changed}


def _line(out: str, word: str, pid: str) -> bool:
    return re.search(rf"^\s+{re.escape(word)}\s+{re.escape(pid)}\s", out, re.M) is not None


@pytest.mark.parametrize("release", VERSIONS)
def test_check_reports_each_patch_and_changes_nothing(release, checkout, build_cli):
    src = checkout(release)
    plan = _plan(src)
    rc, out, err = build_cli("apply", src, "--check", "--patches", PATCHES)
    for step in plan.steps:
        assert _line(out, WORDS[step.state], step.patch.id), out
    assert rc == (1 if plan.drifted else 0), err
    assert _snapshot(src) == {}


@pytest.mark.parametrize("release", VERSIONS)
def test_apply_twice_then_reverse(release, checkout, build_cli):
    src = checkout(release)
    plan = _plan(src)
    rc, out, err = build_cli("apply", src, "--patches", PATCHES)
    if plan.drifted:
        assert rc == 1 and "drift" in err and "nothing was changed" in err
        assert _snapshot(src) == {}
        return
    assert rc == 0, err
    assert sorted(git(src, "diff", "--name-only").split()) == sorted(plan.changed)
    for path in plan.changed:
        assert (src / path).read_text() == plan.after[path]
    for step in plan.steps:
        word = {"applied": "applied", "not needed": "not needed"}.get(step.state, "upstream")
        assert _line(out, word, step.patch.id), out

    applied = _snapshot(src)
    rc, out, err = build_cli("apply", src, "--patches", PATCHES)
    assert rc == 0, err
    assert _snapshot(src) == applied
    assert all(_line(out, "not needed" if s.state == "not needed" else "upstream", s.patch.id) for s in plan.steps), out
    assert "changed 0 file(s)" in out
    rc, out, _ = build_cli("apply", src, "--check", "--patches", PATCHES)
    assert rc == 0 and "would apply" not in out

    rc, out, err = build_cli("apply", src, "--reverse", "--patches", PATCHES)
    assert rc == 0, err
    assert _snapshot(src) == {}
    for step in plan.applying:
        assert _line(out, "reverted", step.patch.id), out
    rc, out, _ = build_cli("apply", src, "--reverse", "--patches", PATCHES)
    assert rc == 0 and "changed 0 file(s)" in out


@pytest.mark.parametrize("release", VERSIONS)
def test_series_grows_with_overlapping_patch(release, checkout, build_cli, tmp_path):
    """An apply after the series gained a patch on the same lines applies only the new one."""
    src = checkout(release)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/_environment.py"
    base = (src / path).read_text().splitlines(keepends=True)
    one = base[:1] + ["# synthetic one\n"] + base[1:]
    two = one[:2] + ["# synthetic two\n"] + one[2:]
    add_synthetic_patch(patches, "synthetic-one", path, "".join(base), "".join(one))
    assert build_cli("apply", src, "--patches", patches)[0] == 0
    add_synthetic_patch(patches, "synthetic-two", path, "".join(one), "".join(two))

    rc, out, err = build_cli("apply", src, "--patches", patches)
    assert rc == 0, err
    assert _line(out, "upstream", "synthetic-one") and _line(out, "applied", "synthetic-two"), out
    assert (src / path).read_text() == "".join(two)
    rc, out, err = build_cli("apply", src, "--reverse", "--patches", patches)
    assert rc == 0, err
    assert _snapshot(src) == {}


@pytest.mark.parametrize("release", VERSIONS)
def test_refuses_dirty_tree(release, checkout, build_cli):
    src = checkout(release)
    touched = {p for patch in load_series(PATCHES) for p in (t.path for t in patch.targets)}
    other = "torch/_VF.py"
    assert other not in touched
    with (src / other).open("a") as f:
        f.write("# local edit\n")
    before = _snapshot(src)
    for extra in ((), ("--check",), ("--reverse",)):
        rc, _, err = build_cli("apply", src, *extra, "--patches", PATCHES)
        assert rc == 1 and "uncommitted changes" in err and other in err
        assert _snapshot(src) == before

    git(src, "checkout", "--", other)
    target = next(p for p in sorted(touched) if (src / p).is_file())
    with (src / target).open("a") as f:
        f.write("# local edit\n")
    before = _snapshot(src)
    rc, _, err = build_cli("apply", src, "--patches", PATCHES)
    assert rc == 1 and "local changes" in err and target in err
    assert _snapshot(src) == before


@pytest.mark.parametrize("release", VERSIONS)
def test_refuses_drift_and_changes_nothing(release, checkout, build_cli, tmp_path):
    src = checkout(release)
    patches = copy_series(tmp_path / "repo", ids=[])
    path = "torch/_environment.py"
    text = (src / path).read_text()
    add_synthetic_patch(patches, "synthetic-fits", path, text, "# fits\n" + text)
    add_synthetic_patch(patches, "synthetic-drift", path, "not in torch\nat all\n", "not in torch\n")

    rc, out, err = build_cli("apply", src, "--check", "--patches", patches)
    assert rc == 1
    assert _line(out, "would apply", "synthetic-fits") and _line(out, "drift", "synthetic-drift"), out
    rc, out, err = build_cli("apply", src, "--patches", patches)
    assert rc == 1 and "synthetic-drift" in err and "nothing was changed" in err
    assert _snapshot(src) == {}


def test_refuses_what_is_not_a_pytorch_checkout(tmp_path, build_cli):
    rc, _, err = build_cli("apply", tmp_path / "missing", "--patches", PATCHES)
    assert rc == 1 and "not a directory" in err
    rc, _, err = build_cli("apply", tmp_path, "--patches", PATCHES)
    assert rc == 1 and "not a PyTorch checkout" in err

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "version.txt").write_text("2.13.0a0\n")
    rc, _, err = build_cli("apply", tmp_path, "--patches", PATCHES)
    assert rc == 1 and "not a git checkout" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch", "version.txt"]

    (tmp_path / "version.txt").write_text("main\n")
    git(tmp_path, "init", "-q")
    rc, _, err = build_cli("apply", tmp_path, "--patches", PATCHES)
    assert rc == 1 and "cannot read a version" in err


def test_verbs_have_help(build_cli):
    for verb in ("apply", "wheel", "stage"):
        with pytest.raises(SystemExit) as exc:
            build_cli(verb, "--help")
        assert exc.value.code == 0


def test_build_sh_dispatches_apply(checkout):
    """``./build.sh apply`` runs this package with the interpreter of TORCH_VERSION."""
    running = next(t for t in installed_torches().values() if t.python == Path(sys.executable))
    src = checkout(running.release)
    env = {**os.environ, "TORCH_VERSION": running.release, "PYTHON": sys.executable}
    help_text = subprocess.run([REPO / "build.sh", "help"], capture_output=True, text=True, env=env).stdout
    for verb in ("apply PYTORCH_SRC", "wheel", "stage PYTORCH_SRC"):
        assert verb in help_text
    proc = subprocess.run([REPO / "build.sh", "apply", src, "--check"], capture_output=True, text=True, env=env)
    assert proc.returncode == (1 if _plan(src).drifted else 0), proc.stderr
    assert f"on {src}" in proc.stdout


def test_a_checkout_older_than_the_supported_releases_is_said(tmp_path, build_cli):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "version.txt").write_text("2.9.0\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
    rc, out, err = build_cli("apply", tmp_path, "--check", "--patches", PATCHES)
    assert "version.txt: torch 2.9.0 is outside the releases this series supports (>= 2.11, < 2.16)" in err
    assert "2.9.0" in out
