"""Stand-in PyTorch checkouts for the build verbs' tests.

No PyTorch checkout is available offline, so a stand-in is a git repository holding the installed
torch's ``torch/**/*.py`` laid out as upstream, plus ``version.txt`` (``2.13.0a0``). One is built per
installed torch: the running one and each venv under ``~/.cache/torch_overlay/venvs``. A wheel has no
C++ sources: each one the series changes is rebuilt from its hunks (:func:`compiled_sources`).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from torch_overlay.series.versions import parse_version, torch_root, torch_version

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
VENVS = Path(os.environ.get("TORCH_OVERLAY_VENVS", "~/.cache/torch_overlay/venvs")).expanduser()
# The issue asks for these two; others are tested when their venv exists.
REQUIRED = ("2.11.0", "2.13.0")
IDENTITY = ("-c", "user.name=stand-in", "-c", "user.email=stand-in@example.invalid")


@dataclass(frozen=True)
class InstalledTorch:
    release: str  # "2.11.0"
    version: str  # torch.__version__, e.g. "2.11.0+cu130"
    python: Path
    site: Path  # the folder holding torch/


def _release(version: str) -> str:
    return ".".join(map(str, parse_version(version)))


def _version_of(site: Path) -> str | None:
    version_py = site / "torch" / "version.py"
    # A venv still being installed has no RECORD yet.
    if not version_py.is_file() or not any(site.glob("torch-*.dist-info/RECORD")):
        return None
    m = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", version_py.read_text(), re.M)
    return m.group(1) if m else None


@functools.cache
def installed_torches() -> dict[str, InstalledTorch]:
    """Release -> installed torch: the running interpreter's, every ready venv's, ``python3``'s."""
    found: dict[str, InstalledTorch] = {}
    running = torch_version()
    found[_release(running)] = InstalledTorch(_release(running), running, Path(sys.executable), torch_root())
    candidates = [
        (v / "bin" / "python", s) for v in sorted(VENVS.glob("*")) for s in v.glob("lib/python*/site-packages")
    ]
    default = shutil.which("python3")
    if default:
        # The machine's default interpreter (2.13.0 here) when the tests run under a venv's.
        proc = subprocess.run(
            [default, "-c", "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            candidates.append((Path(default), Path(proc.stdout.strip()).parent))
    for python, site in candidates:
        version = _version_of(site)
        if version and python.exists() and _release(version) not in found:
            found[_release(version)] = InstalledTorch(_release(version), version, python, site)
    return found


def running_release() -> str:
    return _release(torch_version())


def versions_under_test() -> list[str]:
    return sorted(set(REQUIRED) | set(installed_torches()), key=parse_version)


def git(path: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True)
    return proc.stdout


def make_standin(torch: InstalledTorch, dest: Path) -> Path:
    """A git checkout of ``torch``'s Python files as upstream lays them out, committed."""
    src = torch.site / "torch"
    for file in src.rglob("*.py"):
        if "__pycache__" in file.parts:
            continue
        target = dest / "torch" / file.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    for path, text in compiled_sources(torch.release).items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(text)
    (dest / "version.txt").write_text(f"{torch.release}a0\n")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, *IDENTITY, "commit", "-q", "-m", f"stand-in for PyTorch {torch.release}")
    return dest


def compiled_sources(release: str, patches: Path = PATCHES) -> dict[str, str]:
    """The C++ files the series' variants for ``release`` change, as far as their hunks show them:
    each hunk's old side at the line it names, blank lines elsewhere."""
    from torch_overlay.series.decide import fitting_variants
    from torch_overlay.series.series import read_series

    out: dict[str, str] = {}
    for patch in read_series(patches):
        for variant in fitting_variants(patch, release) if not patch.error else []:
            for diff in variant.files:
                if diff.path.endswith(".py") or diff.path in out:
                    continue
                lines: list[str] = []
                for hunk in diff.hunks:
                    lines += [""] * (hunk.old_start - 1 - len(lines))
                    lines += hunk.side()[0]
                out[diff.path] = "\n".join(lines) + "\n"
    return out


def reset(src: Path) -> Path:
    """Put a stand-in made by :func:`make_standin` back as it was made: one commit on ``main``."""
    base = git(src, "rev-list", "--max-parents=0", "main").split()[0]
    git(src, "checkout", "-q", "-f", "main")
    git(src, "reset", "-q", "--hard", base)
    git(src, "clean", "-q", "-f", "-d", "-x")
    for branch in git(src, "branch", "--format=%(refname:short)").split():
        if branch != "main":
            git(src, "branch", "-q", "-D", branch)
    shutil.rmtree(src / ".git" / "torch-overlay", ignore_errors=True)
    return src


def copy_series(dest: Path, ids: list[str] | None = None) -> Path:
    """A copy of the shipped patches folder (only ``ids`` when given), under ``dest/patches``."""
    from torch_overlay.series.series import read_series

    patches = dest / "patches"
    patches.mkdir(parents=True)
    names = []
    for patch in read_series(PATCHES):
        if ids is None or patch.id in ids:
            for variant in patch.variants:
                shutil.copyfile(variant.path, patches / variant.path.name)
                names.append(variant.path.name)
    (patches / "series").write_text("".join(n + "\n" for n in names))
    # Test paths in a patch are relative to the folder holding patches/.
    if not (dest / "tests").exists():
        (dest / "tests").symlink_to(REPO / "tests")
    return patches


_HEADER = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: torch_overlay tests <tests@example.invalid>
Date: Sat, 21 Nov 2026 00:00:00 +0000
Subject: [PATCH] [synthetic] {title}

Overlay-Id: {id}
Bug: https://github.com/pytorch/pytorch/issues/{bug}, https://example.invalid/other/{bug}
Test: synthetic/test_{stem}.py
Upstream-Test: {upstream}

A synthetic patch for the build tests.
---
"""


def add_synthetic_patch(
    patches: Path, pid: str, path: str, before: str, after: str, bug: int = 1, upstream_test: str | None = None
) -> Path:
    """Append a patch changing ``before`` into ``after`` in ``path`` to the series in ``patches``."""
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    stem = pid.replace("-", "_")
    number = len((patches / "series").read_text().splitlines()) + 1
    name = f"{9000 + number:04d}-{pid}.patch"
    text = (
        _HEADER.format(title=pid, id=pid, bug=bug, stem=stem, upstream=upstream_test or f"test/test_{stem}.py")
        + "".join(diff)
        + "-- \n2.39.5\n"
    )
    (patches / name).write_text(text)
    with (patches / "series").open("a") as f:
        f.write(name + "\n")
    test_file = patches.parent / "synthetic" / f"test_{stem}.py"
    test_file.parent.mkdir(exist_ok=True)
    test_file.write_text(_synthetic_test(stem))
    return patches / name


def _synthetic_test(stem: str) -> str:
    cls = "".join(part.title() for part in stem.split("_"))
    return f"""# Owner(s): ["module: tests"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

from torch.testing._internal.common_utils import run_tests, TestCase


class {cls}Test(TestCase):
    def test_{stem}(self):
        self.assertTrue(True)


if __name__ == "__main__":
    run_tests()
"""
