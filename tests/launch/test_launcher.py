"""``python -m torch_overlay run``: jobs that never import torch_overlay get it in every process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# No import of torch_overlay anywhere in the job's code.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    early = "torch_overlay" in sys.modules  # before any of this script's imports
    import torch.distributed as dist
    import torch._functorch.aot_autograd  # noqa: F401  (imports the AOTAutograd patch targets)

    dist.init_process_group("gloo")
    overlay = sys.modules["torch_overlay"]
    states = {s.id: [str(s.state), s.mode] for s in overlay.status()}
    report = {"rank": dist.get_rank(), "early": early, "states": states}
    with open(f"report-{dist.get_rank()}.json", "w") as f:  # ranks share stdout: one file each
        json.dump(report, f)
    dist.destroy_process_group()
    """
)

SPAWN_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys


    def child(queue):
        queue.put("torch_overlay" in sys.modules)


    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=child, args=(queue,))
        p.start()
        print("CHILD-HAS-OVERLAY", queue.get(timeout=120))
        p.join()
    """
)


# The launcher with no PYTHONPATH: it must make the package importable for the job itself.
LAUNCH = (
    f"import sys; sys.path.insert(0, {str(REPO)!r}); from torch_overlay.launch.launcher import main; sys.exit(main())"
)


def _launch(
    tmp_path: Path, *command: str, env: dict | None = None, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *options, "--", *command],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _torchrun(tmp_path: Path, script: str, *options: str, env: dict | None = None):
    path = tmp_path / "train.py"
    path.write_text(script)
    torchrun = Path(sys.executable).parent / "torchrun"
    runner = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return _launch(tmp_path, *runner, "--standalone", "--nproc_per_node", "2", str(path), env=env, options=options)


def test_torchrun_job_without_an_import_line_gets_the_fixes_on_every_rank(tmp_path):
    proc = _torchrun(tmp_path, RANK_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for report in reports:
        assert report["early"]
        # Unfixed upstream on every supported torch, and its module is loaded by the script.
        assert report["states"]["aot-fresh-alias-outputs"] == ["applied", "at import"]
    assert reports[0]["states"] == reports[1]["states"]


def test_spawned_children_import_the_overlay_too(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SPAWN_SCRIPT)
    proc = _launch(tmp_path, sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHILD-HAS-OVERLAY True" in proc.stdout


def test_an_existing_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['MY_SITECUSTOMIZE_RAN'] = '1'\n")
    probe = "import os, sys; print(os.environ.get('MY_SITECUSTOMIZE_RAN'), 'torch_overlay' in sys.modules)"
    proc = _launch(tmp_path, sys.executable, "-c", probe, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True"]


def test_a_missing_command_is_reported():
    proc = subprocess.run(
        [sys.executable, "-m", "torch_overlay", "run", "--", "no-such-command-here"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 127 and "command not found" in proc.stderr


TINY_JOB = textwrap.dedent(
    """
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()  # no rank leaves while another one still connects to it
    dist.destroy_process_group()
    """
)


def test_one_voice_per_job(tmp_path):
    # The launcher, the torchrun agent and both ranks read the same switches: the launcher says
    # each problem once, and none of the processes it starts repeats it.
    env = {
        "TORCH_OVERLAY": "flase",
        "TORCH_OVERLAY_DISABLE": "aot-fresh-alias-output",
        "TORCH_OVERLAY_DISABLED": "aot-fresh-alias-outputs",
    }
    proc = _torchrun(tmp_path, TINY_JOB, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert out.count("TORCH_OVERLAY='flase' is not understood") == 1, out[-3000:]
    assert out.count("TORCH_OVERLAY_DISABLE names unknown patch id") == 1, out[-3000:]
    assert "did you mean aot-fresh-alias-outputs?" in out
    assert out.count("TORCH_OVERLAY_DISABLED is not a torch_overlay variable") == 1, out[-3000:]
    assert "did you mean TORCH_OVERLAY_DISABLE?" in out


def test_help_says_what_check_ranks_does():
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH, "--help"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--check-ranks=fail" in text and "OverlayError" in text and "TORCH_OVERLAY_STRICT=1" in text
    assert "ranks agree" in text


# Rank 1 pretends to run without one fix (as if TORCH_OVERLAY_DISABLE were set on its node).
CHECK_SCRIPT = textwrap.dedent(
    """
    import logging, os, sys
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overlay = sys.modules["torch_overlay"]
    if os.environ["RANK"] == "1" and os.environ.get("MAKE_RANK_DIFFER"):
        real = overlay.status

        def status():
            rows = real()
            rows[0].state = overlay.PatchState.DISABLED
            return rows

        overlay.status = status
    dist.init_process_group("gloo")  # the launcher checks the ranks right after this
    open(f"done-{dist.get_rank()}", "w").close()
    dist.destroy_process_group()
    """
)


def _lines(proc: subprocess.CompletedProcess, word: str) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if word in line]


def test_check_ranks_after_init_process_group(tmp_path):
    agree = _torchrun(tmp_path, CHECK_SCRIPT, "--check-ranks")
    assert agree.returncode == 0, agree.stderr[-3000:]
    assert (tmp_path / "done-0").exists() and (tmp_path / "done-1").exists()
    assert "differ" not in agree.stderr
    (line,) = _lines(agree, "ranks agree")
    assert line.startswith("torch_overlay: ranks agree (2 ranks, ") and " patches)" in line

    differ = _torchrun(tmp_path, CHECK_SCRIPT, "--check-ranks", env={"MAKE_RANK_DIFFER": "1"})
    assert differ.returncode == 0, differ.stderr[-3000:]
    (head,) = _lines(differ, "ranks differ")  # said once, by rank 0
    assert head.startswith("torch_overlay: ranks differ: [1] of 2"), differ.stderr[-3000:]
    (detail,) = _lines(differ, "rank 1: patch")
    assert detail.startswith("torch_overlay:   rank 1: patch ") and " state disabled " in detail


def test_check_ranks_fail_stops_the_job(tmp_path):
    fail = _torchrun(tmp_path, CHECK_SCRIPT, "--check-ranks=fail", env={"MAKE_RANK_DIFFER": "1"})
    assert fail.returncode != 0, fail.stderr[-3000:]
    assert "OverlayError" in fail.stderr and "torch_overlay: ranks differ" in fail.stderr
    assert not (tmp_path / "done-0").exists() and not (tmp_path / "done-1").exists()

    strict = _torchrun(
        tmp_path, CHECK_SCRIPT, "--check-ranks", env={"MAKE_RANK_DIFFER": "1", "TORCH_OVERLAY_STRICT": "1"}
    )
    assert strict.returncode != 0 and "OverlayError" in strict.stderr
