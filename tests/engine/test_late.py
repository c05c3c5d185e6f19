"""The late path: a module imported before the overlay gets function code swapped, or nothing."""

import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

# A patch written the way upstream would: a new parameter, a dataclass field, a new method.
SHAPED = """\
import dataclasses


@dataclasses.dataclass
class Info:
    name: str


def describe(info):
    return info.name


class Box:
    def get(self):
        return 1
"""
SHAPED_PATCHED = """\
import dataclasses


@dataclasses.dataclass
class Info:
    name: str
    replay: str | None = None


def describe(info, verbose=False):
    return f"{info.name}/{info.replay}" if verbose else info.name


class Box:
    def get(self):
        return self.twice() // 2

    def twice(self):
        return 2
"""


def test_body_changes_are_swapped_into_every_alias(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    mod = importlib.import_module(name)
    alias = mod.REGISTRY["answer"]
    closure = mod.ADD_TWO
    assert mod.cached() == "old"  # fills the lru cache with the old result
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    st = _state(overlay, "fix")
    assert (st.state, st.mode) == ("applied", "swapped"), st.reason
    assert mod.answer() == 42 and alias() == 42
    assert closure(1) == 103 and mod.make_adder(1)(1) == 102  # a closure created before the patch
    assert mod.Widget().size() == 2 and mod.Widget().label == "new"
    assert mod.helper() == "new" and mod.cached() == "new"  # the lru cache was cleared
    assert "[torch_overlay:fix]" in mod.answer.__code__.co_filename
    assert overlay.is_patched(mod.answer) and overlay.is_patched(mod.Widget)
    assert not overlay.is_patched(mod.register)
    assert overlay.get_original(mod.answer)() == 41

    assert overlay.revert() == []
    assert mod.answer() == 41 and alias() == 41 and closure(1) == 3
    assert mod.Widget().size() == 1 and mod.cached() == "old" and not hasattr(mod, "helper")
    assert _state(overlay, "fix").state == "disabled"


def test_a_shape_changing_patch_applies_at_import(sandbox, config, overlays):
    name, path = sandbox.module(SHAPED)
    sandbox.series(("0001-shaped.patch", make_patch("shaped", [make_diff(path, SHAPED, SHAPED_PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(name)
    st = _state(overlay, "shaped")
    assert (st.state, st.mode) == ("applied", "at import"), st.reason
    # Behaves as the source-built module: run the patched text as a fresh module and compare.
    built: dict = {"__name__": "built"}
    exec(compile(SHAPED_PATCHED, "built.py", "exec"), built)
    for ns in (vars(mod), built):
        info = ns["Info"]("a", replay="r")
        assert [f.name for f in __import__("dataclasses").fields(info)] == ["name", "replay"]
        assert ns["describe"](info, verbose=True) == "a/r" and ns["describe"](info) == "a"
        assert ns["Box"]().get() == 1 and ns["Box"]().twice() == 2
    assert overlay.is_patched(mod.describe) and overlay.is_patched(mod.Info)
    assert overlay.get_original(mod.describe)(mod.Info("x")) == "x"
    # Executed at import: revert() cannot undo it and says so.
    (line,) = overlay.revert()
    assert "shaped" in line and "TORCH_OVERLAY_DISABLE=shaped" in line
    assert _state(overlay, "shaped").state == "applied"


def test_a_shape_changing_patch_after_a_late_import_fails_whole(sandbox, config, overlays):
    name, path = sandbox.module(SHAPED)
    mod = importlib.import_module(name)
    sandbox.series(("0001-shaped.patch", make_patch("shaped", [make_diff(path, SHAPED, SHAPED_PATCHED)])))
    overlay = overlays(config())
    with pytest.warns(UserWarning, match="lost, imported too late"):
        overlay.activate()
    st = _state(overlay, "shaped")
    assert st.state == "failed"
    assert st.reason.startswith(f"imported too late: {name} was imported before torch_overlay: ")
    assert "import torch_overlay before `import torch`" in st.reason and "torch-overlay-run" in st.reason
    assert mod.describe(mod.Info("x")) == "x" and not hasattr(mod.Box, "twice")  # untouched


def test_multi_file_patch_with_one_late_module_is_all_or_nothing(sandbox, config, overlays):
    other = "def g():\n    return 1\n"
    name_a, path_a = sandbox.module(SHAPED)
    name_b, path_b = sandbox.module(other)
    mod_a = importlib.import_module(name_a)  # before the overlay; the patch changes its shapes
    patch = make_patch(
        "two-files", [make_diff(path_a, SHAPED, SHAPED_PATCHED), make_diff(path_b, other, other.replace("1", "2"))]
    )
    sandbox.series(("0001-two-files.patch", patch))
    overlay = overlays(config())
    with pytest.warns(UserWarning, match="lost, imported too late"):
        overlay.activate()
    assert _state(overlay, "two-files").state == "failed"
    assert importlib.import_module(name_b).g() == 1  # the other module runs its own code
    assert not hasattr(mod_a.Box, "twice")


def test_a_later_patch_is_decided_without_a_failed_one(sandbox, config, overlays):
    # 0001 cannot be swapped in; 0002 (on the original text) still applies by itself.
    name, path = sandbox.module(SHAPED)
    mod = importlib.import_module(name)
    body_only = SHAPED.replace("return 1", "return 3")
    sandbox.series(
        ("0001-shaped.patch", make_patch("shaped", [make_diff(path, SHAPED, SHAPED_PATCHED)])),
        ("0002-body.patch", make_patch("body", [make_diff(path, SHAPED, body_only)])),
    )
    overlay = overlays(config())
    with pytest.warns(UserWarning, match="lost, imported too late"):
        overlay.activate()
    assert [s.state for s in overlay.status()] == ["failed", "applied"]
    assert mod.Box().get() == 3


def test_a_late_patch_adds_a_definition_before_another_module_imports_it(sandbox, config, overlays):
    # 0001 touches only B, so B comes first in the component; 0002 adds helper() to A and makes B
    # import it: A must get its new definition before B's new import runs.
    a_src = "def f():\n    return 1\n"
    b_src = "def g():\n    return 10\n\n\ndef h():\n    return 0\n"
    name_a, path_a = sandbox.module(a_src)
    name_b, path_b = sandbox.module(b_src)
    mod_a, mod_b = importlib.import_module(name_a), importlib.import_module(name_b)
    b_one = b_src.replace("return 0", "return 5")
    a_two = a_src + "\n\ndef helper():\n    return 32\n"
    b_two = f"from {name_a} import helper\n\n\n" + b_one.replace("return 10", "return 10 + helper()")
    sandbox.series(
        ("0001-b.patch", make_patch("b", [make_diff(path_b, b_src, b_one)])),
        ("0002-ab.patch", make_patch("ab", [make_diff(path_a, a_src, a_two), make_diff(path_b, b_one, b_two)])),
    )
    overlay = overlays(config())
    overlay.activate()
    assert [(s.state, s.mode) for s in overlay.status()] == [("applied", "swapped")] * 2, overlay.status()
    assert mod_b.g() == 42 and mod_b.h() == 5 and mod_a.helper() == 32


def test_a_patch_on_top_of_one_lost_to_a_late_import_is_lost_to_it_too(sandbox, config, overlays):
    # 0001 changes module-level code (lost once the module ran); 0002 is written on top of it: it
    # does not fit the file as torch ships it, and that is the late import's doing, not drift.
    name, path = sandbox.module(SHAPED)
    mod = importlib.import_module(name)
    on_top = SHAPED_PATCHED.replace("return 2", "return 4")
    sandbox.series(
        ("0001-shaped.patch", make_patch("shaped", [make_diff(path, SHAPED, SHAPED_PATCHED)])),
        ("0002-on-top.patch", make_patch("on-top", [make_diff(path, SHAPED_PATCHED, on_top)])),
    )
    overlay = overlays(config())
    with pytest.warns(UserWarning) as warned:
        line = sys._getframe().f_lineno + 1  # the line the warnings point at
        overlay.activate()
    shaped, on_top_row = overlay.status()
    assert shaped.state == on_top_row.state == "failed"
    assert shaped.reason.startswith(f"imported too late: {name} was imported before torch_overlay")
    assert on_top_row.reason.startswith("imported too late: it applies on top of shaped, lost because ")
    assert f"{name} was imported before torch_overlay" in on_top_row.reason
    assert "import torch_overlay before `import torch`" in on_top_row.reason
    # The module that cost them is a field of the row, not text to parse back out of the reason.
    assert (shaped.late, on_top_row.late) == (name, name)
    assert shaped.as_dict()["late"] == name
    # One warning for both: the fixes, the module imported too early, the remedy once.
    (text,) = [str(w.message) for w in warned]
    assert text.startswith("torch_overlay: 2 fixes lost, imported too late: ") and "drift" not in text
    assert f"{name} was imported before torch_overlay" in text and "shaped, on-top" in text
    assert text.count("import torch_overlay before `import torch`") == 1
    # At the test's own line (the user's code), not at the overlay's.
    assert {(w.filename, w.lineno) for w in warned} == {(__file__, line)}
    assert not hasattr(mod.Box, "twice")


def test_real_drift_after_a_late_import_is_still_drift(sandbox, config, overlays):
    name, path = sandbox.module(SHAPED)
    importlib.import_module(name)
    elsewhere = "def unrelated():\n    return 1\n"
    sandbox.series(
        ("0001-shaped.patch", make_patch("shaped", [make_diff(path, SHAPED, SHAPED_PATCHED)])),
        ("0002-stale.patch", make_patch("stale", [make_diff(path, elsewhere, elsewhere.replace("1", "2"))])),
    )
    overlay = overlays(config())
    with pytest.warns(UserWarning):
        overlay.activate()
    assert [s.state for s in overlay.status()] == ["failed", "drift"]
    assert [s.late for s in overlay.status()] == [name, ""]


LATE_JOB = """
import torch.distributed.fsdp, torch.distributed.tensor  # before the overlay: too late for their fixes
import torch_overlay
import json, sys
from torch_overlay.cli.main import _import_targets
from torch_overlay.cli.report import format_status
_import_targets()
rows = torch_overlay.status()
patches = {p.id: p for p in torch_overlay._overlay.patches()}
print(json.dumps({"rows": [[r.id, str(r.state), r.reason, r.late] for r in rows], "text": format_status(rows, patches, 4000)}))
"""


def test_a_late_import_of_torch_modules_reads_imported_too_late_never_drift(tmp_path):
    """On the installed torch: FSDP and DTensor imported before the overlay. Every fix it costs,
    including both of two patches of one file (FSDP's ``_fsdp_state``; on 2.12-2.13 also DTensor
    conv's, where one patch is written on top of the other), says so in status and once in a warning."""
    script = tmp_path / "job.py"
    script.write_text(LATE_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-W", "default::UserWarning", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    rows = {pid: (state, reason) for pid, state, reason, _ in report["rows"]}
    late = {pid: module for pid, _, _, module in report["rows"] if module}
    assert not [pid for pid, (state, _) in rows.items() if state == "drift"], rows
    failed = {pid: reason for pid, (state, reason) in rows.items() if state == "failed"}
    assert failed and all(r.startswith("imported too late: ") for r in failed.values()), failed
    # Each names, as a field, the module imported first (FSDP and DTensor import utils.checkpoint too).
    assert set(late) == set(failed), late
    assert late["fsdp-unused-params-backward-order"].startswith("torch.distributed.fsdp._fully_shard._fsdp_"), late
    # Two patches of FSDP2's _fsdp_state (2.12-2.15; on 2.11 only the first is needed).
    fsdp_state = ("fsdp-unused-params-backward-order", "fsdp-shared-param-grouping-message")
    shared = [p for p in fsdp_state if rows[p][0] != "not needed"]
    assert shared and set(shared) <= set(failed), rows
    # 2.12, 2.13: the width-shard patch is written on top of the depthwise one.
    if rows["dtensor-conv-backward-width-shard"][0] not in ("upstream", "not needed"):
        assert rows["dtensor-conv-depthwise-channel-shard"][1].startswith("imported too late: ")
        reason = rows["dtensor-conv-backward-width-shard"][1]
        assert reason.startswith("imported too late: it applies on top of dtensor-conv-depthwise-channel-shard")
    for pid in failed:
        # status: the row and its "why:" line
        assert re.search(rf"^{re.escape(pid)}\s+failed\b", report["text"], re.M), report["text"]
        assert "why: imported too late: " in report["text"]
    # One warning names every fix lost and the modules imported too early, at the script's
    # `import torch_overlay` line, with the remedy once; the job's first line does not repeat them.
    (warned,) = [line for line in proc.stderr.splitlines() if "OverlayWarning" in line]
    assert warned.startswith(
        f"{script}:3: OverlayWarning: torch_overlay: {len(failed)} fixes lost, imported too late: "
    )
    assert all(pid in warned for pid in failed) and "torch.distributed.fsdp._fully_shard._fsdp_state" in warned
    assert warned.count("import torch_overlay before `import torch`") == 1
    assert "patch " not in warned and len(warned) < 400 + 100 * len(failed)
    (start,) = [line for line in proc.stderr.splitlines() if line.startswith("torch_overlay: torch ")]
    assert f"{len(failed)} lost: imported too late (the warning names them)" in start
    assert "drift" not in proc.stderr


NOISY = """\
import warnings


class _Deprecated:
    def __getattribute__(self, name):
        warnings.warn("this object is deprecated", FutureWarning)
        return object.__getattribute__(self, name)


deprecated = _Deprecated()


def answer():
    return 41
"""


def test_a_swap_reads_no_attribute_of_the_modules_values(sandbox, config, overlays):
    # torch.distributed.reduce_op warns on any attribute read, ``__class__`` included (isinstance).
    name, path = sandbox.module(NOISY)
    mod = importlib.import_module(name)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, NOISY, NOISY.replace("41", "42"))])))
    overlay = overlays(config())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overlay.activate()
    assert (_state(overlay, "fix").state, _state(overlay, "fix").mode) == ("applied", "swapped")
    assert mod.answer() == 42
    assert [str(w.message) for w in caught] == []


FSDP_FIRST = """
import json, warnings
import torch.distributed.fsdp  # before the overlay: its modules get the late path
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch_overlay
print(json.dumps([[w.category.__name__, w.filename, str(w.message)[:200]] for w in caught]))
"""


def test_the_late_path_on_the_installed_torch_triggers_no_warning_of_torchs(tmp_path):
    """FSDP imported first: the only warning is the overlay's own, at the user's line; none of
    torch's (``reduce_op`` is deprecated) and none pointing at the overlay's source."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", FSDP_FIRST], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    caught = json.loads(proc.stdout.splitlines()[-1])
    package = str(Path(__file__).resolve().parents[2] / "torch_overlay")
    assert [w for w in caught if w[0] != "OverlayWarning" or w[1].startswith(package)] == [], caught
    assert [w[1] for w in caught] == ["<string>"], caught
