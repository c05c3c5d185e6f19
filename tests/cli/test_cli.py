import json
import os
import subprocess
import sys
from pathlib import Path

from torch_overlay.series.versions import torch_root

from tests.engine._fixtures import make_diff, make_patch

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "torch_overlay", *args], env=full_env, capture_output=True, text=True)


def test_status_json_covers_every_patch_in_the_series():
    proc = _cli("status", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    ids = [p["id"] for p in report["patches"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 1
    for patch in report["patches"]:
        assert patch["state"] in ("applied", "upstream", "not needed"), patch
        assert patch["title"] and patch["targets"]
        # Bug is optional (some bugs have no upstream report), but always a link.
        assert all(b.strip().startswith("https://") for b in patch["bug"].split(",") if b.strip())
        assert patch["mode"] in ("at import", "swapped", "at import, swapped", "")


def test_status_table_and_lazy_mode():
    proc = _cli("status", "--lazy", TORCH_OVERLAY="0")
    assert proc.returncode == 0
    assert "STATE" in proc.stdout and "disabled" in proc.stdout and "off: TORCH_OVERLAY=0" in proc.stdout


def test_verify_reports_fixed_and_not_needed(tmp_path):
    # A patch against an installed torch file, generated from its actual text.
    rel = "torch/__future__.py"
    old = (torch_root() / rel).read_text()
    needle = "    return _overwrite_module_params_on_conversion\n"
    assert needle in old
    new = old.replace(needle, "    return True\n", 1)
    (tmp_path / "patches").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_future.py").write_text(
        "import torch_overlay  # noqa: F401  # torch_overlay: plumbing\n"
        "import torch\n\n\n"
        "def test_flag():\n"
        "    assert torch.__future__.get_overwrite_module_params_on_conversion() is True\n"
    )
    (tmp_path / "tests" / "test_fine.py").write_text("def test_ok():\n    pass\n")
    fixed = make_patch("future-flag", [make_diff(rel, old, new)], Test="tests/test_future.py")
    fine = make_patch("fine", [make_diff(rel, old, new)], Test="tests/test_fine.py")
    (tmp_path / "patches" / "0001-future-flag.patch").write_text(fixed)
    (tmp_path / "patches" / "0002-fine.patch").write_text(fine)
    (tmp_path / "patches" / "series").write_text("0001-future-flag.patch\n")
    proc = _cli("verify", "--json", TORCH_OVERLAY_PATCHES=str(tmp_path / "patches"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (verdict,) = json.loads(proc.stdout)["verdicts"]
    assert (verdict["without_overlay"], verdict["with_overlay"]) == ("fail", "pass")
    assert verdict["verdict"].startswith("bug present without")

    (tmp_path / "patches" / "series").write_text("0002-fine.patch\n")
    proc = _cli("verify", "--json", TORCH_OVERLAY_PATCHES=str(tmp_path / "patches"))
    (verdict,) = json.loads(proc.stdout)["verdicts"]
    assert verdict["verdict"].startswith("not needed")
