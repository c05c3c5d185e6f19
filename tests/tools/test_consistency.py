"""The runtime overlay and ``build.sh apply`` produce the same source, patch by patch; the patches'
test fields agree with the test modules.

For each installed torch, a subprocess with that torch imports the overlay and every target module
and reports each patch's state and the source the overlay compiled; ``apply`` on the stand-in
checkout of that version must reach the same states and write exactly that source.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess

import pytest

from tests.tools._standin import installed_torches, PATCHES, REPO, versions_under_test
from torch_overlay.series.series import read_series
from torch_overlay.cli.verify import selected_classes
from torch_overlay.tools._checkout import open_checkout
from torch_overlay.series.plan import load_series, plan_series
from torch_overlay.tools._testfile import fix_test

RUNTIME = r"""
import contextlib, io, json
import torch_overlay
from torch_overlay import _overlay
from torch_overlay.cli.main import _import_targets

# The status CLI's way of importing every target (entry points first); it notes failures on stderr.
errors = io.StringIO()
with contextlib.redirect_stderr(errors):
    _import_targets()
texts = {}
for patch in _overlay.patches():
    for target in patch.targets:
        text = _overlay.module_text(target.module)
        if text is not None:
            texts[target.path] = text
states = {row.id: [str(row.state), row.reason] for row in torch_overlay.status()}
notes = [line for line in errors.getvalue().splitlines() if line.startswith("note: cannot import")]
print(json.dumps({"states": states, "texts": texts, "errors": notes}))
"""


@pytest.mark.parametrize("release", versions_under_test())
def test_runtime_source_equals_applied_checkout(release, checkout, build_cli):
    torch = installed_torches().get(release)
    if torch is None:
        pytest.skip(f"torch {release} is not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(PYTHONPATH=str(REPO), TORCH_OVERLAY="1", TORCH_OVERLAY_PATCHES=str(PATCHES))
    proc = subprocess.run([torch.python, "-c", RUNTIME], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runtime = json.loads(proc.stdout.splitlines()[-1])
    assert not runtime["errors"], runtime["errors"]

    src = checkout(release)
    co = open_checkout(src)
    plan = plan_series(load_series(PATCHES), co.version, co.head_text)
    assert {s.patch.id: str(s.state) for s in plan.steps} == {
        pid: state for pid, (state, _) in runtime["states"].items()
    }, runtime["states"]

    rc, _, err = build_cli("apply", src, "--patches", PATCHES)
    assert rc == (1 if plan.drifted else 0), err
    for path, text in runtime["texts"].items():
        # With a drifted patch apply writes nothing; compare with what it checked it would write.
        written = plan.after[path] if plan.drifted else (src / path).read_text()
        assert written == text, f"{path}: apply and the runtime overlay disagree on torch {release}"
    # The runtime reads only the files of patches its fields leave open; each Python file apply
    # changes (C++ hunks only a source build takes: docs/reference/patch-format.md).
    changed = {p for step in plan.applying for p in step.paths if p.endswith(".py")}
    assert changed <= set(runtime["texts"]) <= set(plan.before)


def _camel(pid: str) -> str:
    return "".join(part.title() for part in pid.split("-"))


def test_fix_tests_are_one_class_per_fix_in_modules_mirroring_upstream():
    """Test, Test-Select, Quick-Test, Error-Test and Guard-Test agree with tests/fixes/, and stage can cut
    each fix's classes out of its module: valid Python, no plumbing, no version gate."""
    owner: dict[tuple[str, str], str] = {}  # (module, class) -> fix id
    for patch in read_series(PATCHES):
        for variant in patch.variants:
            fields = {**(patch.main.fields if patch.main else {}), **variant.fields}
            test, upstream = fields["Test"], fields["Upstream-Test"]
            assert test == "tests/fixes/" + upstream.removeprefix("test/"), f"{variant.path.name}: {test}"
            classes = selected_classes(fields.get("Test-Select", ""))
            assert classes and classes[0] == f"Test{_camel(patch.id)}", f"{variant.path.name}: {classes}"
            assert all(c.startswith(classes[0]) for c in classes), classes
            for node in filter(None, (fields["Quick-Test"], fields.get("Error-Test"))):
                path, cls, _ = node.split("::")
                assert path == test and any(cls.startswith(c) for c in classes), node
            pairs = [(test, c) for c in classes]
            if fields.get("Guard-Test"):
                guard, _, guard_class = fields["Guard-Test"].partition("::")
                assert guard == "tests/fixes/" + fields["Upstream-Guard-Test"].removeprefix("test/")
                pairs.append((guard, guard_class))
            for module, cls in pairs:
                assert owner.setdefault((module, cls), patch.id) == patch.id, f"{cls} belongs to two fixes"
    modules = sorted({module for module, _ in owner})
    for module in modules:
        text = (REPO / module).read_text()
        defined = [n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef)]
        tests = [c for c in defined if c.startswith("Test")]
        mine = {cls: pid for (m, cls), pid in owner.items() if m == module}
        assert set(tests) == set(mine), f"{module}: test classes without a fix, or missing: {set(tests) ^ set(mine)}"
        # verify selects with pytest -k, a substring match: no class may match another fix's name.
        for cls in tests:
            for name, pid in mine.items():
                assert name.lower() not in cls.lower() or mine[cls] == pid, f"-k {name} also selects {cls}"
        by_fix: dict[str, list[str]] = {}
        for cls, pid in mine.items():
            by_fix.setdefault(pid, []).append(cls)
        for pid, classes in by_fix.items():
            staged = fix_test(text, classes)
            compile(staged, module, "exec")
            assert not re.search(r"torch_overlay|_torch_gates|\bbefore\(|for_torch|skip_before", staged), pid
            kept = {n.name for n in ast.parse(staged).body if isinstance(n, ast.ClassDef)}
            assert kept & set(tests) == set(classes), f"{pid}: {kept & set(tests)}"
