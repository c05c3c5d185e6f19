"""The runtime overlay and ``build.sh apply`` produce the same source, patch by patch.

For each installed torch, a subprocess with that torch imports the overlay and every target module
and reports each patch's state and the source the overlay compiled; ``apply`` on the stand-in
checkout of that version must reach the same states and write exactly that source.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.tools._standin import installed_torches, PATCHES, REPO, versions_under_test
from torch_overlay.tools._checkout import open_checkout
from torch_overlay.tools._plan import load_series, plan_series

RUNTIME = r"""
import contextlib, io, json
import torch_overlay
from torch_overlay import _overlay
from torch_overlay.__main__ import _import_targets

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
    assert set(runtime["texts"]) == {p for p in plan.before}
