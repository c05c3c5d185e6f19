"""The CLI's first words: ``--version``, a bare ``torch-overlay``, ``verify`` without pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from torch_overlay._version import __version__

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, python: str = sys.executable, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([python, "-m", "torch_overlay", *args], env=full_env, capture_output=True, text=True)


def test_version():
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"torch_overlay {__version__}"


def test_a_bare_command_lists_the_commands_and_exits_2():
    proc = _cli()
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert out.startswith("usage: ")
    for command in ("status", "verify", "explain", "run"):
        assert re.search(rf"^\s+{command}\s", out, re.M), out
    assert not re.search(r"\bcmd\b", out), out


def test_verify_without_pytest_says_how_to_install_it(tmp_path):
    # A Python that cannot import pytest (as after `pip install -e .` without the [test] extra).
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _NoPytest(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pytest' or name.startswith('pytest.') or name == '_pytest':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _NoPytest())\n"
    )
    proc = _cli("verify", "--quick", PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install '.[test]'" in proc.stderr and "torch_overlay[test]" in proc.stderr, proc.stderr
    assert "No module named pytest" not in proc.stdout
