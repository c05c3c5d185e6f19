"""The bootstrap ``sitecustomize``: what a job's process does at start-up, with unusual setups
(other installs' bootstraps, a sitecustomize of the user's, strict mode, a shell between two Pythons)."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from torch_overlay.launch.env import BOOTSTRAP, launch_env

from ..tools._standin import installed_torches, running_release
from .test_launcher import _launch

REPO = Path(__file__).resolve().parents[2]
PROBE = "import builtins, sys; print(getattr(builtins, 'user_site_runs', 0), 'torch_overlay' in sys.modules)"


def _user_site(folder: Path) -> Path:
    """A sitecustomize of the user's that counts its runs in this process."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.user_site_runs = getattr(builtins, 'user_site_runs', 0) + 1\n"
    )
    return folder


def _python(*args: str, pythonpath: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_OVERLAY", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), **extra)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _other_install(tmp_path: Path) -> Path:
    """Another torch_overlay install (a second checkout): its package folder's parent."""
    other = tmp_path / "other-checkout"
    shutil.copytree(REPO / "torch_overlay", other / "torch_overlay", ignore=shutil.ignore_patterns("__pycache__"))
    return other


@pytest.mark.parametrize("order", ["ours first", "theirs first"])
def test_two_installs_bootstraps_run_the_users_sitecustomize_once(tmp_path, order):
    other = _other_install(tmp_path)
    theirs = other / "torch_overlay" / "launch" / "_bootstrap"
    # A bootstrap copied where the layout does not say what it is: known by its text.
    loose = tmp_path / "loose-bootstrap"
    loose.mkdir()
    shutil.copy(BOOTSTRAP / "sitecustomize.py", loose)
    bootstraps = [str(BOOTSTRAP), str(theirs), str(loose)]
    if order == "theirs first":
        bootstraps.reverse()
    user = _user_site(tmp_path / "site")
    proc = _python("-c", PROBE, pythonpath=[*bootstraps, str(REPO), str(other), str(user)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Error in sitecustomize" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "True"]


def test_a_strict_child_whose_overlay_import_fails_stops(tmp_path):
    env = launch_env({"PYTHONPATH": ""})
    missing = str(tmp_path / "no-such-series")
    job = "print('THE JOB RAN')"
    strict = _python(
        "-c", job, pythonpath=[env["PYTHONPATH"]], cwd=tmp_path, TORCH_OVERLAY_PATCHES=missing, TORCH_OVERLAY_STRICT="1"
    )
    assert strict.returncode == 1 and "THE JOB RAN" not in strict.stdout
    assert "TORCH_OVERLAY_STRICT=1, so this process stops" in strict.stderr and missing in strict.stderr
    relaxed = _python("-c", job, pythonpath=[env["PYTHONPATH"]], cwd=tmp_path, TORCH_OVERLAY_PATCHES=missing)
    assert relaxed.returncode == 0 and "THE JOB RAN" in relaxed.stdout, relaxed.stderr[-3000:]
    assert missing in relaxed.stderr


def test_a_users_sitecustomize_that_raises_leaves_the_overlay_on(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise RuntimeError('broken site setup')\n")
    proc = _launch(tmp_path, sys.executable, "-c", PROBE, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "True"]
    assert "Error in sitecustomize" in proc.stderr and "RuntimeError: broken site setup" in proc.stderr


def test_a_users_sitecustomize_in_a_zip_still_runs(tmp_path):
    archive = tmp_path / "site.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(_user_site(tmp_path / "site") / "sitecustomize.py", "sitecustomize.py")
    proc = _launch(tmp_path, sys.executable, "-c", PROBE, env={"PYTHONPATH": str(archive)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "True"]


def test_a_shell_between_two_pythons_passes_the_overlay_on(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "outer.py").write_text(
        f"import subprocess\nsubprocess.run(['sh', '-c', {sys.executable + ' probe.py'!r}], check=True)\n"
    )
    proc = _launch(tmp_path, "sh", "-c", f"{sys.executable} outer.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "True"]


@pytest.mark.parametrize("flag", ["-I", "-E", "-S"])
def test_an_isolated_child_runs_without_the_overlay(tmp_path, flag):
    # By design (docs/reliability.md): -I and -E ignore PYTHONPATH, -S imports no sitecustomize.
    proc = _launch(tmp_path, sys.executable, flag, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "False"]


def _another_torch() -> Path | None:
    """The site-packages of an installed torch other than the running one, for this Python."""
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for release, installed in installed_torches().items():
        if release != running_release() and installed.site.parent.name == python:
            return installed.site
    return None


def test_the_overlay_decides_for_the_torch_a_users_sitecustomize_picks(tmp_path):
    site = _another_torch()
    if site is None:
        pytest.skip("no other torch installed for this Python")
    user = tmp_path / "site"
    user.mkdir()
    (user / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(site)!r})\n")
    probe = (
        "import json, torch_overlay, torch\n"
        "from torch_overlay.series.versions import torch_root, torch_version\n"
        "print(json.dumps([torch.__version__, torch_version(), str(torch_root())]))\n"
    )
    proc = _launch(tmp_path, sys.executable, "-c", probe, env={"PYTHONPATH": str(user)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported, decided_for, root = json.loads(proc.stdout.splitlines()[-1])
    assert decided_for == imported and Path(root) == site.resolve()


def test_a_torch_put_on_sys_path_after_the_overlay_is_said_and_left_alone(tmp_path):
    # A usercustomize, or the script itself, may change sys.path after the bootstrap imported the overlay.
    site = _another_torch()
    if site is None:
        pytest.skip("no other torch installed for this Python")
    fix = "aot-fresh-alias-outputs"  # unfixed upstream on every supported torch
    script = tmp_path / "job.py"
    script.write_text(
        f"import json, sys\nsys.path.insert(0, {str(site)!r})\n"
        "import torch, torch._functorch.aot_autograd, torch_overlay\n"
        f"print(json.dumps({{s.id: str(s.state) for s in torch_overlay.status()}}[{fix!r}]))\n"
    )
    proc = _launch(tmp_path, sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == "failed"
    assert f"was imported from {site.resolve()}" in proc.stderr
    strict = _launch(tmp_path, sys.executable, str(script), env={"TORCH_OVERLAY_STRICT": "1"})
    assert strict.returncode == 1 and "OverlayError" in strict.stderr, strict.stderr[-3000:]


def test_a_python_without_torch_in_a_strict_job_runs_and_says_nothing(tmp_path):
    base = Path(sys.base_prefix) / "bin" / "python3"
    has_torch = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    if not base.exists() or subprocess.run([str(base), "-S", "-c", has_torch]).returncode != 0:
        pytest.skip("no Python without torch here")
    proc = _launch(tmp_path, str(base), "-c", "print('THE TOOL RAN')", env={"TORCH_OVERLAY_STRICT": "1"})
    assert proc.returncode == 0 and proc.stdout.split() == ["THE", "TOOL", "RAN"], proc.stderr[-3000:]
    assert "torch_overlay" not in proc.stderr
