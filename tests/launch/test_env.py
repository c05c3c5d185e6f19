"""The environment the launcher, and a process that imported torch_overlay, hand to a job's processes:
the user's ``PYTHONPATH`` as it was (ours added around it), and the switches meaning what they meant."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from torch_overlay.launch.env import BOOTSTRAP, launch_env

from .test_launcher import _launch

REPO = Path(__file__).resolve().parents[2]
FIX = "aot-fresh-alias-outputs"  # unfixed upstream on every supported torch


def _user_job(tmp_path: Path) -> Path:
    """``mylib.py`` in ``tmp_path`` (the job's current folder), and a script in another folder importing it."""
    (tmp_path / "mylib.py").write_text("WHERE = 'cwd'\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    script = scripts / "train.py"
    script.write_text("import sys, mylib\nprint(mylib.WHERE, 'torch_overlay' in sys.modules)\n")
    return script


def test_an_empty_pythonpath_entry_still_means_the_current_folder(tmp_path):
    # What `export PYTHONPATH=$PYTHONPATH:/opt/x` makes when PYTHONPATH was unset.
    script = _user_job(tmp_path)
    for safe_path in ("", "1"):  # PYTHONSAFEPATH leaves out the script's folder, not PYTHONPATH's entries
        env = {"PYTHONPATH": f"{os.pathsep}/opt/x", "PYTHONSAFEPATH": safe_path}
        proc = _launch(tmp_path, sys.executable, str(script), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["cwd", "True"]


def test_a_child_of_a_process_that_imported_the_overlay_keeps_the_empty_entry(tmp_path):
    script = _user_job(tmp_path)
    parent = (
        "import subprocess, sys, torch_overlay\n"
        f"sys.exit(subprocess.run([sys.executable, {str(script)!r}]).returncode)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-c", parent], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["cwd", "True"]


def test_the_users_entries_are_kept_exactly_and_come_before_the_checkout():
    user = os.pathsep.join(["", "/opt/x", "", "rel/lib"])
    path = launch_env({"PYTHONPATH": user})["PYTHONPATH"]
    assert path == os.pathsep.join([str(BOOTSTRAP), user, str(REPO)])
    assert launch_env({"PYTHONPATH": path})["PYTHONPATH"] == path  # a child's child: unchanged
    assert launch_env({})["PYTHONPATH"] == os.pathsep.join([str(BOOTSTRAP), str(REPO)])  # no "": no cwd
    # The checkout already among the user's entries stays where the user put it.
    assert launch_env({"PYTHONPATH": f"{REPO}{os.pathsep}/opt/x"})["PYTHONPATH"].endswith("/opt/x")


def test_a_users_package_named_like_one_of_the_checkout_wins(tmp_path):
    lib = tmp_path / "lib"
    (lib / "tests").mkdir(parents=True)  # the checkout has a package `tests` too
    (lib / "tests" / "__init__.py").write_text("WHOSE = 'user'\n")
    probe = "import tests; print(getattr(tests, 'WHOSE', tests.__file__))"
    proc = _launch(tmp_path, sys.executable, "-c", probe, env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["user"]


CHILD_IN_ANOTHER_FOLDER = textwrap.dedent(
    f"""
    import json, os, subprocess, sys
    import torch_overlay

    code = (
        "import json, os, sys, torch._functorch.aot_autograd\\n"
        "ov = sys.modules.get('torch_overlay')\\n"
        "state = None if ov is None else {{s.id: str(s.state) for s in ov.status()}}[{FIX!r}]\\n"
        "print(json.dumps([state, os.environ['TORCH_OVERLAY_PATCHES'], os.environ['TORCH_OVERLAY_CACHE_DIR']]))\\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd="elsewhere", capture_output=True, text=True)
    print(json.dumps([proc.returncode, proc.stdout.strip().splitlines()[-1:], proc.stderr[-2000:]]))
    """
)


def test_relative_path_switches_are_handed_on_absolute(tmp_path):
    # Under strict, a child that resolved `patches` against its own folder would stop (or, before,
    # run unpatched and exit 0): it must read the parent's series, and cache in the parent's folder.
    (tmp_path / "patches").symlink_to(REPO / "patches")
    (tmp_path / "elsewhere").mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")},
        "PYTHONPATH": str(REPO),
        "TORCH_OVERLAY_STRICT": "1",
        "TORCH_OVERLAY_PATCHES": "patches",
        "TORCH_OVERLAY_CACHE_DIR": "cache",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_IN_ANOTHER_FOLDER], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc, out, err = json.loads(proc.stdout.splitlines()[-1])
    assert rc == 0 and out, err
    assert json.loads(out[0]) == ["applied", str(tmp_path / "patches"), str(tmp_path / "cache")]
    launched = launch_env({"TORCH_OVERLAY_PATCHES": "p", "TORCH_OVERLAY_CACHE_DIR": "~/c"})
    assert launched["TORCH_OVERLAY_PATCHES"] == os.path.abspath("p")
    assert launched["TORCH_OVERLAY_CACHE_DIR"] == os.path.expanduser("~/c")
