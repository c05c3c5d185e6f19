"""``build.sh stage PYTORCH_SRC``: one upstream-style commit per patch, on a new branch.

Each commit carries the patch's diff and its test classes (``Test-Select``) placed at
``Upstream-Test``, with the module-level names they use and without plumbing or torch-version gates,
with a PyTorch-style message: title, summary, ``Fixes #N``, test plan. A Markdown PR body per patch
is written next to the branch (by default inside the checkout's ``.git``). Offline; nothing outside
the checkout is touched. Everything is checked before the branch is created.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..series.patchfile import PatchFile
from ..cli.verify import selected_classes
from . import BuildError
from ._checkout import Checkout, open_checkout
from ..series.plan import PatchState, Step, apply_variant, load_series, plan_series, series_hash
from ._testfile import fix_test, merge_test, reproducer_names

__all__ = ["StagedPatch", "commit_message", "pr_body", "run_stage"]

_ISSUE_RE = re.compile(r"^https://github\.com/pytorch/pytorch/issues/(\d+)/?$")
_DEFAULT_AUTHOR = ("torch_overlay", "torch-overlay@users.noreply.github.com")


@dataclass
class StagedPatch:
    step: Step
    test_path: str  # Upstream-Test
    test_text: str  # the file at test_path after this commit
    test_command: str
    message: str
    # Guard-Test placed at Upstream-Guard-Test: that path and the file after this commit
    guard_tests: dict[str, str] = field(default_factory=dict)


def _field(step: Step, name: str) -> str:
    """A field of the variant that applies, else of the patch's main file."""
    variant, main = step.variant, step.patch.main
    return (variant.fields.get(name) if variant else None) or (main.fields.get(name, "") if main else "")


def _author(variant: PatchFile) -> tuple[str, str]:
    m = re.search(r"^From: (.+?) <([^>]+)>$", variant.text.split("\n\n", 1)[0], re.M)
    return (m.group(1), m.group(2)) if m else _DEFAULT_AUTHOR


def commit_message(step: Step, test_command: str) -> str:
    """Title, summary, ``Fixes #N`` per pytorch/pytorch issue, other bug links, test plan."""
    variant = step.variant
    assert variant is not None
    bugs = [b.strip() for b in _field(step, "Bug").split(",") if b.strip()]
    fixes = [f"Fixes #{m.group(1)}" for m in map(_ISSUE_RE.match, bugs) if m]
    others = [b for b in bugs if not _ISSUE_RE.match(b)]
    parts = [variant.title, variant.description]
    if fixes:
        parts.append("\n".join(fixes))
    if others:
        parts.append("Related: " + ", ".join(others))
    parts.append(f"Test Plan:\n{test_command}")
    return "\n\n".join(p.strip() for p in parts if p.strip()) + "\n"


def pr_body(staged: StagedPatch) -> str:
    """The PR description: the commit message laid out in Markdown."""
    title, _, rest = staged.message.partition("\n\n")
    summary = rest.rsplit("Test Plan:", 1)[0].strip()
    return f"# {title.strip()}\n\n## Summary\n\n{summary}\n\n## Test plan\n\n```\n{staged.test_command}\n```\n"


def _prepare(checkout: Checkout, steps: list[Step], repo: Path) -> list[StagedPatch]:
    """Each commit's test file and message; refuse before any change if one cannot be made."""
    tests: dict[str, str] = {}

    def add_test(pid: str, path: str, upstream: str, select: str) -> str:
        """Merge the classes ``select`` of our test module ``path`` into ``upstream``; the command
        that runs their tests."""
        classes = selected_classes(select)
        try:
            ours = fix_test((repo / path).read_text(encoding="utf-8"), classes)
        except BuildError as e:
            raise BuildError(f"{pid}: {path}: {e}") from e
        existing = tests[upstream] if upstream in tests else checkout.head_text(upstream)
        tests[upstream] = ours if existing is None else merge_test(existing, ours, upstream)
        select = " or ".join(classes or reproducer_names(ours))
        return f"python {upstream}" + (f" -k {shlex.quote(select)}" if select else "")

    out = []
    for step in steps:
        test, upstream = _field(step, "Test"), _field(step, "Upstream-Test")
        if not test or not (repo / test).is_file():
            raise BuildError(f"{step.patch.id}: its Test {test or '(none)'} is not a file under {repo}")
        if not upstream:
            raise BuildError(f"{step.patch.id}: no Upstream-Test field, so the test has no place upstream")
        for path in step.paths:
            checkout.path(path, f"{step.patch.id}: diff path")
        checkout.path(upstream, f"{step.patch.id}: Upstream-Test")
        commands = [add_test(step.patch.id, test, upstream, _field(step, "Test-Select"))]
        guard_tests = {}
        guard, guard_upstream = _field(step, "Guard-Test"), _field(step, "Upstream-Guard-Test")
        # Guard-Test: the module, or a node `module::Class` naming the guard's class
        guard, _, guard_class = guard.partition("::")
        if guard or guard_upstream:
            if not (guard and guard_upstream and (repo / guard).is_file()):
                raise BuildError(
                    f"{step.patch.id}: Guard-Test {guard or '(none)'} needs a file under {repo} "
                    "and an Upstream-Guard-Test"
                )
            checkout.path(guard_upstream, f"{step.patch.id}: Upstream-Guard-Test")
            commands.append(add_test(step.patch.id, guard, guard_upstream, guard_class))
            guard_tests[guard_upstream] = tests[guard_upstream]
        command = "\n".join(commands)
        out.append(StagedPatch(step, upstream, tests[upstream], command, commit_message(step, command), guard_tests))
    return out


def _commit_all(checkout: Checkout, plan_before: dict[str, str], staged: list[StagedPatch]) -> None:
    texts = dict(plan_before)
    configured = checkout.git("config", "user.email", check=False).strip()
    for item in staged:
        variant = item.step.variant
        assert variant is not None
        texts = apply_variant(variant, texts)
        checkout.write({**{p: texts[p] for p in item.step.paths}, item.test_path: item.test_text, **item.guard_tests})
        checkout.git("add", "--", *item.step.paths, item.test_path, *item.guard_tests)
        name, email = _author(variant)
        # With no git identity (CI), commit as the patch's author; otherwise as the user, whose
        # identity upstream's CLA check will look for.
        identity = [] if configured else ["-c", f"user.name={name}", "-c", f"user.email={email}"]
        checkout.git(*identity, "commit", "-q", "-F", "-", input=item.message)


def run_stage(
    src: Path | str,
    patches_dir: Path,
    *,
    out_dir: Path | None = None,
    branch: str | None = None,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    checkout = open_checkout(src)
    patches = load_series(patches_dir)
    changed = checkout.changed_paths()
    if changed:
        raise BuildError(
            f"the checkout {checkout.root} has uncommitted changes ({', '.join(changed[:5])});"
            " stage needs a clean tree; nothing was changed"
        )
    plan = plan_series(patches, checkout.version, checkout.head_text)
    for step in plan.steps:
        if step.state in (PatchState.UPSTREAM, PatchState.NOT_NEEDED):
            out.write(f"  skip      {step.patch.id}  ({step.state}: {step.reason})\n")
    if plan.drifted:
        raise BuildError(
            "patch(es) do not fit this checkout (drift): "
            + "; ".join(f"{s.patch.id}: {s.reason}" for s in plan.drifted)
            + "; nothing was changed"
        )
    if not plan.applying:
        out.write(f"nothing to stage: every patch is already in {checkout.root} (version.txt {checkout.version})\n")
        return 0
    staged = _prepare(checkout, plan.applying, patches_dir.resolve().parent)

    branch = branch or f"torch-overlay/{series_hash(patches)}"
    if checkout.git("rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False).strip():
        raise BuildError(f"branch {branch} already exists in {checkout.root}; delete it or pass --branch")
    checkout.git("check-ref-format", "--branch", branch)
    out_dir = out_dir or checkout.git_dir() / "torch-overlay" / branch.replace("/", "-")
    start = checkout.branch()
    checkout.git("checkout", "-q", "-b", branch)
    try:
        _commit_all(checkout, plan.before, staged)
    except BaseException:
        # Back to where we started: the tree was clean, so nothing of the user's is lost.
        checkout.git("reset", "-q", "--hard", check=False)
        checkout.git("checkout", "-q", start, check=False)
        checkout.git("branch", "-q", "-D", branch, check=False)
        new_tests = {s.test_path for s in staged} | {p for s in staged for p in s.guard_tests}
        checkout.git("clean", "-q", "-f", "--", *new_tests, check=False)
        raise
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in staged:
        out.write(f"  commit    {item.step.patch.id}  {item.message.splitlines()[0]}\n")
        (out_dir / f"{item.step.patch.id}.md").write_text(pr_body(item), encoding="utf-8")
    out.write(
        f"staged {len(staged)} commit(s) on branch {branch} (from {start}) in {checkout.root}\n"
        f"PR bodies: {out_dir}/<id>.md\n"
        f"next: cd {shlex.quote(str(checkout.root))} && ghstack submit\n"
    )
    return 0
