"""``pip install .`` into a fresh venv gives the console scripts and the packaged patch series.

The venv sees the packages of the interpreter running the test (torch, pip, setuptools) and
builds without isolation, so the test downloads nothing; the project is copied first, so the
build leaves nothing in the repo.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from torch_overlay._series import read_series

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "torch_overlay", "patches")


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


def test_pip_install_then_torch_overlay_status_reads_the_packaged_series(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    # Like --system-site-packages, but the packages of the interpreter running this test (a venv's
    # torch too): torch, pip and setuptools without a download.
    (Path(sysconfig.get_path("purelib", vars={"base": str(venv)})) / "parent.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n"
    )
    # Neither this checkout nor an overlay switch may leak into the installed package's run.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TORCH_OVERLAY")}
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", src]
    if _setuptools_version() >= (68,):
        pip.append("--no-build-isolation")  # else pip fetches a newer setuptools for the build
    proc = subprocess.run(pip, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (venv / "bin" / "torch-overlay-run").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [venv / "bin" / "torch-overlay", "status"], capture_output=True, text=True, env=env, cwd=elsewhere
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = re.search(r"patches from (\S+)", proc.stdout).group(1)
    assert Path(where).is_relative_to(venv) and where.endswith("torch_overlay/patches"), where
    listed = {line.split()[0] for line in proc.stdout.splitlines()[2:] if line[:1].isalnum()}
    assert listed == {p.id for p in read_series(REPO / "patches")}

    # One version source: the metadata pip recorded is the package's own __version__.
    code = "import importlib.metadata as m, torch_overlay._version as v\n"
    code += "print(m.version('torch_overlay'), v.__version__)"
    out = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True, env=env, cwd=elsewhere)
    installed, own = out.stdout.split()
    assert installed == own
