"""``pip install .`` into a fresh venv gives the console scripts and the packaged patch series.

The venv sees the packages of the interpreter running the test (torch, pip, setuptools) and
builds without isolation, so the test downloads nothing; the project is copied first, so the
build leaves nothing in the repo.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.launch.test_launcher import RANK_SCRIPT
from torch_overlay.series.series import read_series

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "torch_overlay", "patches")


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install .`` of a copy of the project into a fresh venv: (venv, env for its commands)."""
    tmp_path = tmp_path_factory.mktemp("packaging")
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
    return venv, env


def test_pip_install_then_torch_overlay_status_reads_the_packaged_series(installed, tmp_path):
    venv, env = installed
    assert (venv / "bin" / "torch-overlay-run").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [venv / "bin" / "torch-overlay", "status"], capture_output=True, text=True, env=env, cwd=elsewhere
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The first line names the series' folder (wrapped before a long path when the terminal is narrow).
    where = re.search(r"patches from\s+(\S+)", proc.stdout).group(1)
    assert Path(where).is_relative_to(venv) and where.endswith("torch_overlay/patches"), where
    rows = subprocess.run(
        [venv / "bin" / "torch-overlay", "status", "--json"], capture_output=True, text=True, env=env, cwd=elsewhere
    )
    listed = {row["id"] for row in json.loads(rows.stdout)["patches"]}
    assert listed == {p.id for p in read_series(REPO / "patches")}

    # One version source: the metadata pip recorded is the package's own __version__.
    code = "import importlib.metadata as m, torch_overlay._version as v\n"
    code += "print(m.version('torch_overlay'), v.__version__)"
    out = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True, env=env, cwd=elsewhere)
    installed, own = out.stdout.split()
    assert installed == own


def test_the_wheel_ships_every_module_and_the_bootstrap(installed):
    venv, _ = installed
    site_pkg = Path(sysconfig.get_path("purelib", vars={"base": str(venv)})) / "torch_overlay"
    ours = {p.relative_to(REPO / "torch_overlay") for p in (REPO / "torch_overlay").rglob("*.py")}
    shipped = {p.relative_to(site_pkg) for p in site_pkg.rglob("*.py")}
    assert ours - shipped == set()
    assert (site_pkg / "launch" / "_bootstrap" / "sitecustomize.py").is_file()


def test_the_installed_launcher_gives_every_rank_of_a_gloo_job_its_fixes(installed, tmp_path):
    venv, env = installed
    (tmp_path / "train.py").write_text(RANK_SCRIPT)
    python = str(venv / "bin" / "python")
    job = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py"]
    proc = subprocess.run(
        [venv / "bin" / "torch-overlay-run", *job], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["early"]
        assert report["states"]["aot-fresh-alias-outputs"] == ["applied", "at import"]
    assert reports[0]["states"] == reports[1]["states"]


def _launched(venv: Path, env: dict[str, str], python: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; print('torch_overlay' in sys.modules)"
    return subprocess.run(
        [venv / "bin" / "torch-overlay-run", python, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_a_child_python_without_torch_overlay_says_it_runs_without_the_fixes(installed, tmp_path):
    venv, env = installed
    other = Path(sys.executable)  # this test's own Python: torch, but not torch_overlay (not on its path here)
    probe = subprocess.run([other, "-c", "import torch, torch_overlay"], capture_output=True, env=env, cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip(f"{other} can import torch_overlay")
    proc = _launched(venv, env, other, tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["False"]
    assert "could not import torch_overlay" in proc.stderr and "WITHOUT the overlay's fixes" in proc.stderr


def test_a_child_python_without_torch_is_left_alone(installed, tmp_path):
    # A tool the job starts with another Python (no torch there): nothing to fix, nothing to say.
    venv, env = installed
    other = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([other, "-c", "import torch"], capture_output=True, env=env, cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip(f"{other} has torch")
    proc = _launched(venv, env, other, tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["False"]
    assert proc.stderr == ""


def test_the_launcher_refuses_to_start_without_its_bootstrap(installed, tmp_path):
    venv, env = installed
    site_pkg = Path(sysconfig.get_path("purelib", vars={"base": str(venv)})) / "torch_overlay"
    broken = tmp_path / "broken"
    shutil.copytree(site_pkg, broken / "torch_overlay", ignore=shutil.ignore_patterns("_bootstrap"))
    proc = subprocess.run(
        [venv / "bin" / "python", "-m", "torch_overlay", "run", "--", "python", "-c", "pass"],
        env={**env, "PYTHONPATH": str(broken)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "sitecustomize.py is missing" in proc.stderr, proc.stderr


def test_the_installed_verify_says_once_that_it_runs_from_a_checkout(installed, tmp_path):
    venv, env = installed
    proc = subprocess.run(
        [venv / "bin" / "torch-overlay", "verify"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.count("verify runs from a source checkout") == 1, proc.stderr
    assert "no reproducer test found" not in proc.stdout + proc.stderr


def test_pip_install_then_explain_answers_from_the_packaged_data(installed, tmp_path):
    """The known bugs ship with the package: the patches' Error: lines and looked-at.toml."""
    venv, env = installed
    log = tmp_path / "job.log"
    log.write_text(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/x/moe.py", line 3, in <module>\n'
        "[rank0]: torch._inductor.exc.InductorError: AssertionError: failed OrderedSet([]) >= "
        "OrderedSet([u4]) (inductor >= fx)\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/x/moe.py", line 3, in <module>\n'
        "[rank1]: torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: trying to save more "
        "tensors during recomputation than during the original forward pass.\n"
    )
    proc = subprocess.run(
        [venv / "bin" / "torch-overlay", "explain", "--json", "--torch", "2.12.1", log],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = [(e["ranks"], [m["id"] for m in e["matches"]]) for e in json.loads(proc.stdout)["errors"]]
    assert found == [(["0"], ["inductor-unbacked-split-slice"]), (["1"], ["compile-ac-recompute-other-graph"])]
