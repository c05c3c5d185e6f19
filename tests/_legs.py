"""CI runs the suite on three torch releases (``.ci/run``): one *full* leg (2.11.0, the oldest
supported torch, where most bugs of the series exist) runs everything; the two *light* legs
(``TORCH_OVERLAY_TEST_LEG=light``: 2.13.0 and 2.15.0) run what can differ from one torch to another:

- of each fix's tests (``tests/fixes``), its ``Quick-Test`` and ``Error-Test`` (the smallest
  reproducer of each fix, with the overlay: the fix works on that torch, or torch has it);
- the engine, the series rules, status, explain and the hint (the decisions are per torch);
- the rebuilt 2.13.0 wheel (``tests/tools/test_wheel.py``, on the 2.13.0 leg);
- one torchrun job through the launcher.

The tools (apply, stage, compare, bench, packaging...), the checks, the recipes and every
multi-process class run on the full leg only. A local ``./build.sh test`` runs everything.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIGHT = os.environ.get("TORCH_OVERLAY_TEST_LEG") == "light"

one_leg = pytest.mark.skipif(LIGHT, reason="runs on CI's full leg only (TORCH_OVERLAY_TEST_LEG=light)")

# Folders and files whose tests run on every leg (the rest of tests/ runs on the full leg only).
EVERY_LEG = (
    "tests/engine/",
    "tests/series/",
    "tests/known/",
    "tests/cli/test_cli.py",
    "tests/cli/test_status_text.py",
    "tests/cli/test_usage.py",
    "tests/cli/test_failure_line.py",
    "tests/tools/test_wheel.py::test_wheel_213",  # the real 2.13.0 wheel: on the 2.13.0 leg
    "tests/tools/test_catalogue_pages.py",
    "tests/test_config.py",
    "tests/test_import_circles.py",
    "tests/test_layout.py",
    "tests/launch/test_launcher.py::test_torchrun_job_without_an_import_line_gets_the_fixes_on_every_rank",
    # What a job's processes get from the launcher, the bootstrap and the job's lines: per torch.
    "tests/launch/test_env.py",
    "tests/launch/test_bootstrap.py",
    "tests/launch/test_job_lines.py",
)
_NODE_FIELD = re.compile(r"^(?:Quick-Test|Error-Test):\s*(\S+)", re.M)


@cache
def fix_reproducers() -> frozenset[str]:
    """The node ids every patch variant names as its ``Quick-Test`` or ``Error-Test``."""
    nodes: set[str] = set()
    for patch in (REPO / "patches").glob("*.patch"):
        head = patch.read_text(encoding="utf-8").split("\n---\n", 1)[0]
        nodes.update(_NODE_FIELD.findall(head))
    return frozenset(nodes)


def light_leg_skip(nodeid: str) -> str | None:
    """Why a light leg leaves out the test ``nodeid``, or None when it runs it."""
    if nodeid.startswith("tests/fixes/"):
        base = nodeid.split("[", 1)[0]
        if base in fix_reproducers():
            return None
        return "light leg: each fix's Quick-Test/Error-Test only (CI's full leg runs every test)"
    if any(nodeid.startswith(prefix) for prefix in EVERY_LEG):
        return None
    return "runs on CI's full leg only (TORCH_OVERLAY_TEST_LEG=light)"
