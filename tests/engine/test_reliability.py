"""What the engine guarantees when things go wrong: reload, strict, missing targets, bad series."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_overlay.engine.overlay import Overlay
from torch_overlay._state import OverlayError

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

REPO = Path(__file__).resolve().parents[2]


def test_reload_runs_the_patched_source_again(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlays(config()).activate()
    mod = importlib.import_module(name)
    assert importlib.reload(mod).answer() == 42


def test_reload_of_a_swapped_module_keeps_the_fix(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    mod = importlib.import_module(name)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    assert _state(overlay, "fix").mode == "swapped"
    mod = importlib.reload(mod)
    assert mod.answer() == 42 and mod.helper() == "new"
    st = _state(overlay, "fix")
    assert st.state == "applied" and "at import" in st.mode


def test_strict_holds_for_every_import_attempt(sandbox, config, overlays):
    name, path = sandbox.module(MODULE.replace("return 41", "return 40"))
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlays(config(strict=True)).activate()
    for _ in range(2):
        with pytest.raises(OverlayError, match="drift"):
            importlib.import_module(name)
        assert name not in sys.modules


def test_a_target_that_does_not_exist_fails(sandbox, config, overlays):
    patch = make_patch("ghost", [make_diff("torch/_ovt_no_such_module.py", "x = 1\n", "x = 2\n")])
    sandbox.series(("0001-ghost.patch", patch))
    overlay = overlays(config())
    with pytest.warns(UserWarning, match="not found"):
        overlay.activate()
    st = _state(overlay, "ghost")
    assert st.state == "failed" and "torch/_ovt_no_such_module.py not found" in st.reason


def test_patched_source_that_raises_falls_back_to_the_original(sandbox, config, overlays):
    src = "VALUE = 1\n\n\ndef f():\n    return VALUE\n"
    bad = "VALUE = 1 // 0\n\n\ndef f():\n    return VALUE\n"
    name, path = sandbox.module(src)
    sandbox.series(("0001-bad.patch", make_patch("bad", [make_diff(path, src, bad)])))
    overlay = overlays(config())
    overlay.activate()
    with pytest.warns(UserWarning, match="ZeroDivisionError"):
        mod = importlib.import_module(name)
    assert mod.f() == 1 and _state(overlay, "bad").state == "failed"


@pytest.mark.parametrize("layout", ["missing", "file", "no-series", "empty-series", "not-utf8-series"])
def test_an_unreadable_series_warns_and_status_fails(tmp_path, layout):
    where = tmp_path / "patches"
    if layout == "file":
        where.write_text("not a folder")
    elif layout != "missing":
        where.mkdir()
        if layout == "empty-series":
            (where / "series").write_text("# nothing\n")
        elif layout == "not-utf8-series":
            (where / "series").write_bytes(b"# caf\xe9 (latin-1)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_PATCHES": str(where)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "status", "--lazy"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert str(where) in proc.stderr
    strict = subprocess.run(
        [sys.executable, "-c", "import torch_overlay"],
        env={**env, "TORCH_OVERLAY_STRICT": "1"},
        capture_output=True,
        text=True,
    )
    assert strict.returncode == 1 and "OverlayError" in strict.stderr


def test_a_series_or_patch_that_is_not_utf8_never_stops_a_launched_job(tmp_path):
    where = tmp_path / "patches"
    where.mkdir()
    (where / "series").write_bytes(b"0001-x.patch\n")
    (where / "0001-x.patch").write_bytes(b"Subject: [PATCH] caf\xe9\n\n")
    launcher = "from torch_overlay.launch.launcher import main; main()"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_PATCHES": str(where)}
    job = [sys.executable, "-c", launcher, sys.executable, "-c", "print('THE JOB RAN')"]
    proc = subprocess.run(job, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "THE JOB RAN" in proc.stdout, proc.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "torch_overlay", "status"], env=env, capture_output=True, text=True)
    assert status.returncode == 1 and "cannot be read" in status.stdout + status.stderr, status.stdout + status.stderr
    (where / "series").write_bytes(b"0001-x.patch # caf\xe9\n")
    proc = subprocess.run(job, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "THE JOB RAN" in proc.stdout, proc.stderr[-3000:]
    assert f"{where / 'series'} cannot be read" in proc.stderr


def test_an_unknown_disabled_id_warns_with_the_closest_known_id(sandbox, config):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = Overlay(config(disabled_ids=frozenset({"fxi"})))
    with pytest.warns(UserWarning, match=r"unknown patch id\(s\) fxi \(did you mean fix\?\)"):
        overlay.activate()
    overlay.revert()


def test_a_switch_value_not_understood_is_reported_and_the_kill_switch_holds():
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY": "disabled"}
    code = "import torch_overlay; print(sorted({str(s.state) for s in torch_overlay.status()}))"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["['disabled']"]
    assert "TORCH_OVERLAY='disabled' is not understood" in proc.stderr
    status = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "status", "--lazy"], env=env, capture_output=True, text=True
    )
    assert status.returncode == 1 and "not understood" in status.stderr


def test_a_warning_is_printed_once():
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_OVERLAY_DISABLE": "no-such-fix"}
    code = "import logging; logging.basicConfig(); import torch_overlay"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no-such-fix") == 1, proc.stderr


def test_a_malformed_hunk_fails_its_patch_when_its_module_is_imported(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    diff = make_diff(path, MODULE, PATCHED).replace("@@ -", "@@ -1,99 +1,99 @@\n@@ -", 1)  # counts that lie
    sandbox.series(("0001-fix.patch", make_patch("fix", [diff])))
    overlay = overlays(config())
    overlay.activate()
    assert _state(overlay, "fix").state == "pending"  # hunks are parsed when first needed
    with pytest.warns(UserWarning, match="fix failed: malformed patch"):
        mod = importlib.import_module(name)
    assert mod.answer() == 41 and _state(overlay, "fix").state == "failed"


def test_import_torch_overlay_parses_no_diff():
    code = (
        "import sys, torch_overlay\n"
        "variants = [v for p in torch_overlay._overlay.patches() for v in p.variants]\n"
        "print(len(variants), sum(v.parsed is not None for v in variants), 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    total, parsed, torch_imported = proc.stdout.split()
    assert int(total) > 0 and (parsed, torch_imported) == ("0", "False"), proc.stderr


def test_two_patch_files_that_claim_one_id_fail_it_and_say_both(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    other = PATCHED.replace("42", "43")
    sandbox.series(
        ("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])),
        ("0002-fix.patch", make_patch("fix", [make_diff(path, MODULE, other)], subject="another fix")),
    )
    overlay = overlays(config())
    with pytest.warns(
        UserWarning, match="patch fix failed: malformed patch: 0001-fix.patch and 0002-fix.patch both say"
    ):
        overlay.activate()
    (row,) = overlay.status()
    assert (row.id, row.state) == ("fix", "failed") and "0002-fix.patch" in row.reason
    assert importlib.import_module(name).answer() == 41  # neither applied


def test_a_variant_file_shares_its_patchs_id(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    sandbox.series(
        ("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])),
        ("0001-fix@2.11.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)], Torch_Versions="<2.12")),
    )
    overlay = overlays(config())
    overlay.activate()
    assert [(s.id, s.state) for s in overlay.status()] == [("fix", "pending")]
