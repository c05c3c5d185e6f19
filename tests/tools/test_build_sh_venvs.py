"""``build.sh``'s private venvs: the exact torch, whatever a machine-wide pip constraint says.

pip installs from a folder of tiny stand-in wheels (``torch`` and the test tools), with no index
and no pip config files, so each venv takes seconds instead of a 4.6 GB download. The machine's
cap is simulated the way pip.conf's ``global.constraint`` reaches pip: ``PIP_CONSTRAINT``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("expecttest", "hypothesis", "pytest", "numpy", "safetensors")


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def _wheel(folder: Path, name: str, version: str) -> None:
    """A pure-Python wheel ``name==version`` whose package only knows its version."""
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
        f"{name}/version.py": f'__version__ = "{version}"\n',
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in files.items()]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record + [f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def _wheels(tmp_path: Path, *torches: str) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    for version in torches:
        _wheel(folder, "torch", version)
    for tool in TOOLS:
        _wheel(folder, tool, "1.0")
    return folder


def _build_sh(tmp_path: Path, wheels: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    cap = tmp_path / "cap.txt"
    cap.write_text("torch<=2.14.1\n")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TORCH_"))}
    full_env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_CONSTRAINT=str(cap),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheels),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        TORCH_OVERLAY_VENVS=str(tmp_path / "venvs"),
        TORCH_OVERLAY_BASE_PYTHON=sys.executable,
        **env,
    )
    return subprocess.run([REPO / "build.sh", *args], capture_output=True, text=True, env=full_env, timeout=300)


def _torch_in(python: str) -> str:
    code = "import importlib.metadata as m; print(m.version('torch'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_venv_gets_the_exact_torch_above_a_pip_cap(tmp_path):
    wheels = _wheels(tmp_path, "2.14.1", "2.15.0", "2.16.0")
    proc = _build_sh(tmp_path, wheels, "python", TORCH_VERSION="2.15.0")
    assert proc.returncode == 0, proc.stderr
    python = proc.stdout.strip().splitlines()[-1]
    assert python == str(tmp_path / "venvs" / "2.15.0" / "bin" / "python")
    assert _torch_in(python) == "2.15.0"
    # The install says what it installs, where and why.
    assert "installing torch==2.15.0" in proc.stderr and "private venv" in proc.stderr


def test_venv_left_without_torch_is_rebuilt_and_pips_error_shown(tmp_path):
    venv = tmp_path / "venvs" / "2.15.0"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    wheels = _wheels(tmp_path, "2.14.1")  # no 2.15.0: pip must fail, and say so
    proc = _build_sh(tmp_path, wheels, "python", TORCH_VERSION="2.15.0")
    assert proc.returncode != 0
    assert "has no torch 2.15.0" in proc.stderr and "rebuilding" in proc.stderr
    assert "No matching distribution found for torch==2.15.0" in proc.stderr

    _wheel(wheels, "torch", "2.15.0")
    proc = _build_sh(tmp_path, wheels, "python", TORCH_VERSION="2.15.0")
    assert proc.returncode == 0, proc.stderr
    assert _torch_in(proc.stdout.strip().splitlines()[-1]) == "2.15.0"


def test_python_with_another_torch_is_refused_not_installed_into(tmp_path):
    wheels = _wheels(tmp_path)
    # A version the running interpreter's torch is not (CI runs this file with 2.11, 2.13 and 2.15).
    running = importlib.metadata.version("torch")
    other = "2.12.1" if not running.startswith("2.12.1") else "2.14.1"
    proc = _build_sh(tmp_path, wheels, "python", TORCH_VERSION=other, PYTHON=sys.executable)
    assert proc.returncode == 2
    assert f"PYTHON={sys.executable} has torch" in proc.stderr
    assert not (tmp_path / "venvs").exists()
