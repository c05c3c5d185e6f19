"""Reach (TORCH_OVERLAY_REACH=1): each fix's changed functions are watched, and nothing else."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_overlay.engine.reach import Reach

from ._fixtures import make_diff, make_patch
from .test_apply import _state, overlays  # noqa: F401  (overlays is a fixture)

REPO = Path(__file__).resolve().parents[2]

MODULE = """\
LIMIT = 1


def answer():
    return 41


def helper():
    return answer()


class Widget:
    def size(self):
        return 1

    def other(self):
        return 0
"""
# fix-a: answer's body; fix-b: Widget.size's body; fix-c: a module-level constant only.
FIX_A = MODULE.replace("return 41", "return 42")
FIX_B = FIX_A.replace("        return 1\n", "        return 2\n")
FIX_C = FIX_B.replace("LIMIT = 1", "LIMIT = 2")


@pytest.fixture
def module(sandbox):
    name, path = sandbox.module(MODULE)
    sandbox.series(
        ("0001-fix-a.patch", make_patch("fix-a", [make_diff(path, MODULE, FIX_A)])),
        ("0002-fix-b.patch", make_patch("fix-b", [make_diff(path, FIX_A, FIX_B)], Silent="sizes were off by one")),
        ("0003-fix-c.patch", make_patch("fix-c", [make_diff(path, FIX_B, FIX_C)])),
    )
    return name


@pytest.fixture
def stop_reach():
    made = []
    yield made.append
    for overlay in made:
        if overlay.reach is not None:
            overlay.reach.stop()
    assert sys.getprofile() is None


def start(overlay):
    """What ``import torch_overlay`` does under TORCH_OVERLAY_REACH=1."""
    overlay.reach = Reach(overlay._roster.made).watch_live(overlay._roster.components)


def _report(overlay):
    return {row["id"]: (row["calls"], row["silent"]) for row in overlay.reach.report()}


def test_counts_the_runs_of_the_changed_functions_only(module, config, overlays, stop_reach):
    overlay = overlays(config(reach=True))
    stop_reach(overlay)
    overlay.activate()
    start(overlay)
    mod = importlib.import_module(module)
    assert _state(overlay, "fix-c").state == "applied"
    for _ in range(3):
        assert mod.helper() == 42  # helper is unchanged: only answer counts
    mod.Widget().other()
    assert _report(overlay) == {"fix-a": (3, ""), "fix-b": (0, "sizes were off by one"), "fix-c": (None, "")}
    mod.Widget().size()
    assert _report(overlay)["fix-b"] == (1, "sizes were off by one")


def test_counts_swapped_functions_of_a_module_imported_first(module, config, overlays, stop_reach):
    mod = importlib.import_module(module)
    overlay = overlays(config(reach=True))
    stop_reach(overlay)
    overlay.activate()
    start(overlay)
    assert (_state(overlay, "fix-a").state, _state(overlay, "fix-a").mode) == ("applied", "swapped")
    mod.answer()
    mod.Widget().size()
    mod.Widget().size()
    assert {k: v[0] for k, v in _report(overlay).items() if k != "fix-c"} == {"fix-a": 1, "fix-b": 2}


def test_started_later_watches_what_already_applied(module, config, overlays, stop_reach):
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(module)
    assert overlay.reach is None
    stop_reach(overlay)
    start(overlay)
    mod.answer()
    assert _report(overlay)["fix-a"] == (1, "")


def test_off_by_default_watches_nothing(module, config, overlays):
    overlay = overlays(config())
    overlay.activate()
    importlib.import_module(module).answer()
    assert overlay.reach is None and sys.getprofile() is None


# A DTensor op under a fake process group: its sharding propagation runs new_factory_strategy,
# which dtensor-new-factory-shard-partial changes (applied on torch < 2.14).
TINY = textwrap.dedent(
    """
    import json, sys
    import torch_overlay
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
    x.new_ones((4, 4))
    print(json.dumps({"reach": torch_overlay.reach(), "profile": sys.getprofile() is not None}))
    """
)
REACHED = "dtensor-new-factory-shard-partial"
UNREACHED = "clip-grad-norm-mixed-meshes"  # torch.nn.utils is imported by torch: applied, never called here


def _run(tmp_path, **switches):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **switches)
    (tmp_path / "tiny.py").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "tiny.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_job_with_reach_on_says_which_fixes_ran(tmp_path):
    out, stderr = _run(tmp_path, TORCH_OVERLAY_REACH="1")
    rows = {row["id"]: row for row in out["reach"]}
    if REACHED not in rows:
        pytest.skip(f"{REACHED} does not apply to this torch")
    assert rows[REACHED]["calls"] > 0 and rows[UNREACHED]["calls"] == 0
    assert out["profile"] is (sys.version_info < (3, 12))  # 3.12+: sys.monitoring, no profile function
    (end,) = [line for line in stderr.splitlines() if " applied in " in line]
    ran = end.split("changed code run by ", 1)[1]
    assert f"{REACHED} (" in ran and UNREACHED not in ran


def test_a_job_with_reach_off_installs_no_hook(tmp_path):
    out, stderr = _run(tmp_path, TORCH_OVERLAY_REACH="0")
    assert out == {"reach": None, "profile": False}
    (end,) = [line for line in stderr.splitlines() if " applied in " in line]
    assert "changed code run" not in end


def test_a_deletion_is_counted_for_the_function_that_held_it():
    """Deleted lines belong to the def around them, even where a blank line follows them
    (0020's hunk on 2.11 deletes a block inside a function, then comes a blank line)."""
    import ast

    from torch_overlay.engine.modcode import _changed_qualnames

    before = "def f(x):\n    y = x\n\n    if y:\n        raise ValueError\n\n    return y\n\n\ndef g():\n    return 1\n"
    after = before.replace("    if y:\n        raise ValueError\n\n", "")
    assert _changed_qualnames(before, after, ast.parse(after)) == ["f"]
    # The last lines of a function: what follows them is the next def, which did not change.
    after = before.replace("\n    return y\n", "\n")
    assert _changed_qualnames(before, after, ast.parse(after)) == ["f"]
