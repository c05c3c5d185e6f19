"""The CLI's verbs that read the series as data (``explain``, the build tools) do not activate the overlay.

Each command runs in a fresh Python whose ``sitecustomize`` (first on ``PYTHONPATH``) writes at exit
whether torch_overlay was imported, whether its import hook is on ``sys.meta_path`` and whether its
traceback hint is on ``sys.excepthook``: what activation installs. ``import torch_overlay`` itself,
and the verbs that report on the overlay, still activate it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_REPORT = """
import atexit, json, os, sys

def _report():
    hook = [type(f).__module__ for f in sys.meta_path if type(f).__module__.startswith("torch_overlay")]
    with open(os.environ["ACTIVATION_REPORT"], "w") as f:
        json.dump({
            "imported": "torch_overlay" in sys.modules,
            "hook": hook,
            "hint": bool(getattr(sys.excepthook, "_torch_overlay_hint", False)),
        }, f)

atexit.register(_report)
"""


def _activation(tmp_path: Path, *args: str) -> dict[str, object]:
    """What running ``python *args`` left installed, as the sitecustomize saw it at exit."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_REPORT)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
        ACTIVATION_REPORT=str(report),
        TORCH_OVERLAY_CACHE_DIR=str(tmp_path / "cache"),
    )
    proc = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert report.is_file(), proc.stderr
    return json.loads(report.read_text())


@pytest.fixture
def log(tmp_path: Path) -> str:
    path = tmp_path / "job.log"
    path.write_text("RuntimeError: something nobody has seen before\n")
    return str(path)


def test_explain_imports_the_package_without_activating(tmp_path, log):
    assert _activation(tmp_path, "-m", "torch_overlay", "explain", log) == {
        "imported": True,
        "hook": [],
        "hint": False,
    }


def test_the_console_script_explain_does_not_activate(tmp_path, log):
    script = tmp_path / "torch-overlay"  # what pip writes for the console script
    script.write_text("import sys\nfrom torch_overlay.cli.main import main\nsys.exit(main())\n")
    assert _activation(tmp_path, str(script), "explain", log)["hook"] == []


def test_the_build_tools_do_not_activate(tmp_path):
    assert _activation(tmp_path, "-m", "torch_overlay.tools", "--help") == {
        "imported": True,
        "hook": [],
        "hint": False,
    }


def test_import_torch_overlay_activates(tmp_path):
    found = _activation(tmp_path, "-c", "import torch_overlay")
    assert found["hook"] == ["torch_overlay.engine.importhook"]
    assert found["hint"] is True


def test_status_activates(tmp_path):
    found = _activation(tmp_path, "-m", "torch_overlay", "status", "--lazy", "--json")
    assert found["hook"] == ["torch_overlay.engine.importhook"]
