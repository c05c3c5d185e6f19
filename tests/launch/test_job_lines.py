"""What a job says about the overlay by itself: once per job, which torch and how many fixes (when
torch is first imported), and at exit which fixes that process applied; late imports warned once.

Every case is a real job (a torchrun of 2 ranks on gloo, or one Python), with the switches a user
would have: the test session's ``TORCH_OVERLAY_QUIET=1`` (tests/conftest.py) is taken out.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START = "torch_overlay: torch "  # the job's first line
END = " applied in "  # the exit line: "N fixes applied in rank 0: ..."

TINY_JOB = textwrap.dedent(
    """
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    """
)

# FSDP and DTensor imported before the overlay: too late for the fixes that change their modules.
LATE_JOB = textwrap.dedent(
    """
    import torch.distributed.fsdp, torch.distributed.tensor
    import torch_overlay
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    """
)

LAUNCH = (
    f"import sys; sys.path.insert(0, {str(REPO)!r}); from torch_overlay.launch.launcher import main; sys.exit(main())"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def _torchrun(tmp_path: Path, script: str, *, launcher: bool, **extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    torchrun = Path(sys.executable).parent / "torchrun"
    runner = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    command = [*runner, "--standalone", "--nproc_per_node", "2", str(path)]
    if launcher:
        command = [sys.executable, "-c", LAUNCH, "--", *command]
        env = _env(**extra)
    else:
        env = _env(PYTHONPATH=str(REPO), **extra)
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _lines(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def test_a_launcher_job_says_once_that_the_overlay_ran_and_what_it_applied(tmp_path):
    proc = _torchrun(tmp_path, TINY_JOB, launcher=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (start,) = [line for line in proc.stderr.splitlines() if line.startswith(START)]
    assert " fixes active" in start and "python -m torch_overlay status" in start and "TORCH_OVERLAY_QUIET=1" in start
    (end,) = _lines(proc.stderr, END)
    # `import torch` imports torch.nn.utils.clip_grad on every supported torch.
    assert end.startswith("torch_overlay: ") and " applied in rank 0: " in end and "clip-grad-norm-mixed-meshes" in end
    assert proc.stdout == ""  # stderr only: the job's own output is left alone

    quiet = _torchrun(tmp_path, TINY_JOB, launcher=True, TORCH_OVERLAY_QUIET="1")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "torch_overlay" not in quiet.stderr, quiet.stderr[-3000:]


def test_a_late_import_in_a_two_rank_job_is_warned_once_per_rank(tmp_path):
    proc = _torchrun(tmp_path, LATE_JOB, launcher=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One warning per rank (what a rank imports first depends on the code it runs: rank 0 may
    # have lost nothing) names every fix lost, at the script's `import torch_overlay` line.
    warned, other_rank = _lines(proc.stderr, "OverlayWarning")
    assert other_rank == warned
    head = f"{tmp_path / 'train.py'}:3: OverlayWarning: torch_overlay: "
    assert warned.startswith(head) and " fixes lost, imported too late: " in warned, warned
    ids = warned.split(" so torch is left unpatched for ", 1)[1].split(" (", 1)[0].split(", ")
    assert "fsdp-unused-params-backward-order" in ids  # FSDP2's _fsdp_state: lost on every supported torch
    assert warned.startswith(f"{head}{len(ids)} fixes lost") and warned.count("torch-overlay-run") == 1
    assert "drift" not in proc.stderr
    (start,) = [line for line in proc.stderr.splitlines() if line.startswith(START)]
    assert f"{len(ids)} lost: imported too late (the warning names them)" in start
    (end,) = _lines(proc.stderr, END)
    assert " applied in rank 0" in end and f"{len(ids)} lost: imported too late" in end


def _python(code: str, **extra: str) -> subprocess.CompletedProcess:
    env = _env(PYTHONPATH=str(REPO), **extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def test_an_import_job_says_it_on_stderr_and_keeps_logging_as_it_is():
    proc = _python("import torch_overlay, torch, logging; print(logging.getLogger().handlers)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"  # no handler, no basicConfig of ours
    assert len([line for line in proc.stderr.splitlines() if line.startswith(START)]) == 1
    (end,) = _lines(proc.stderr, END)
    assert " applied in this process: " in end

    # A script that set up logging gets the lines through its own handler, once each.
    code = (
        "import logging; logging.basicConfig(level=logging.INFO, format='MINE %(name)s: %(message)s')\n"
        "import torch_overlay, torch\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert len(_lines(proc.stderr, START)) == 1 and _lines(proc.stderr, START)[0].startswith("MINE torch_overlay: ")
    assert len(_lines(proc.stderr, END)) == 1 and _lines(proc.stderr, END)[0].startswith("MINE torch_overlay: ")

    assert "torch_overlay" not in _python("import torch_overlay, torch", TORCH_OVERLAY_QUIET="1").stderr
    assert "torch_overlay" not in _python("import torch_overlay, torch", TORCH_OVERLAY="0").stderr


def test_a_warm_import_counts_the_fixes_it_made_no_entry_for():
    """A warm import makes no entry for the patches of modules it does not import (engine/roster.py):
    its lines count them all the same, as ``status`` does in a process that lists them."""
    counts = (
        "import torch_overlay, torch\n"
        "rows = torch_overlay.status()\n"
        "print(len(rows), sum(r.state in ('pending', 'applied') for r in rows), sum(r.state == 'pending' for r in rows))\n"
    )
    _python(counts)  # the activation memo and the series index are stored
    lines = _python("import torch_overlay, torch; print(torch_overlay._overlay._roster.unmade())")
    assert lines.returncode == 0, lines.stderr
    assert int(lines.stdout) > 0  # recalled: some patches have no entry in this process
    total, active, pending = map(int, _python(counts).stdout.split())
    (start,) = _lines(lines.stderr, START)
    assert f" {active} fixes active (of {total}: " in start, (start, total, active)
    (end,) = _lines(lines.stderr, END)
    assert f"; {pending} not used (their modules were not imported)" in end, (end, pending)


def test_the_cli_says_no_job_lines():
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "status", "--json"],
        env=_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not _lines(proc.stderr, START) and not _lines(proc.stderr, END), proc.stderr


def test_a_warning_of_the_launcher_points_at_no_line_of_ours(tmp_path):
    # The console script pip writes for torch-overlay-run: its import line is not the user's code.
    script = tmp_path / "torch-overlay-run"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from torch_overlay.cli.main import main_run\nsys.exit(main_run())\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), sys.executable, "-c", "pass"],
        env=_env(TORCH_OVERLAY="flase"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (warned,) = _lines(proc.stderr, "OverlayWarning")
    assert warned.startswith("<torch_overlay>:0: OverlayWarning: torch_overlay: TORCH_OVERLAY='flase'"), proc.stderr
    assert "main_run" not in proc.stderr and str(REPO / "torch_overlay") not in proc.stderr


def test_the_exit_line_is_logged_through_the_handlers_a_job_set_up(caplog):
    from torch_overlay.engine.once_per_job import tell

    with caplog.at_level(logging.INFO, logger="torch_overlay"):
        tell("torch_overlay: a line")
    assert [r.getMessage() for r in caplog.records] == ["torch_overlay: a line"]
