"""Once per job: a problem of the switches is warned once, not by every process of a job.

Each case is a fresh ``python -c "import torch_overlay"`` (no torch import), with the environment a
launcher, a torchrun agent or a rank would have.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_overlay.engine import once_per_job

REPO = Path(__file__).resolve().parents[2]
TYPO = "TORCH_OVERLAY='flase' is not understood"
# Prints what this process passes on to its children.
PROBE = f"import os, torch_overlay; print(os.environ.get({once_per_job.REPORTED!r}, ''))"


def _import(**env: str) -> subprocess.CompletedProcess:
    full = {
        k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY") and k not in ("RANK", "LOCAL_RANK")
    }
    full.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300)


def test_a_single_process_always_says_it_and_marks_its_children():
    proc = _import(TORCH_OVERLAY="flase")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(TYPO) == 1
    marker = proc.stdout.strip()
    assert marker
    # A child with that environment (an agent, a rank, a DataLoader worker) stays quiet ...
    child = _import(TORCH_OVERLAY="flase", **{once_per_job.REPORTED: marker})
    assert TYPO not in child.stderr and child.stdout.strip() == marker
    # ... but not about another value, which its parent never said.
    other = _import(TORCH_OVERLAY="flasee", **{once_per_job.REPORTED: marker})
    assert "TORCH_OVERLAY='flasee' is not understood" in other.stderr


@pytest.mark.parametrize(
    ("rank_vars", "said"), [({"RANK": "0"}, True), ({"RANK": "1"}, False), ({"LOCAL_RANK": "3"}, False)]
)
def test_under_torchrun_rank_0_says_it(rank_vars, said):
    proc = _import(TORCH_OVERLAY="flase", **rank_vars)
    assert (TYPO in proc.stderr) is said, proc.stderr


def test_strict_still_raises_where_it_would_stay_quiet():
    marker = _import(
        TORCH_OVERLAY_STRICT="1", TORCH_OVERLAY_DISABLED="x", RANK="1", **{once_per_job.REPORTED: "whatever"}
    )
    assert marker.returncode != 0 and "OverlayError" in marker.stderr and "TORCH_OVERLAY_DISABLED" in marker.stderr


def test_an_unknown_id_names_the_closest_one_not_all():
    proc = _import(TORCH_OVERLAY_DISABLE="aot-fresh-alias-output")
    (line,) = [text for text in proc.stderr.splitlines() if "TORCH_OVERLAY_DISABLE" in text]
    assert "aot-fresh-alias-output (did you mean aot-fresh-alias-outputs?)" in line
    assert "dtensor-new-factory-shard-partial" not in line  # the other ids are not listed


def test_a_misspelled_variable_is_said():
    proc = _import(TORCH_OVERLAY_DISABLED="aot-fresh-alias-outputs")
    assert proc.stderr.count("TORCH_OVERLAY_DISABLED is not a torch_overlay variable") == 1
    assert "did you mean TORCH_OVERLAY_DISABLE?" in proc.stderr


def test_pass_on_keeps_what_the_parent_said():
    environ = {once_per_job.REPORTED: "a"}
    once_per_job.pass_on("one", environ)
    once_per_job.pass_on("one", environ)
    keys = environ[once_per_job.REPORTED].split(",")
    assert keys[0] == "a" and len(keys) == 2
    assert once_per_job.said_elsewhere("one", environ) and not once_per_job.said_elsewhere("two", environ)


LATE_PROBE = "import torch.distributed.tensor, torch_overlay"  # DTensor's registrations of some fixes are lost


@pytest.mark.parametrize("rank_vars", [{}, {"RANK": "0"}, {"RANK": "1"}, {"LOCAL_RANK": "3"}])
def test_every_rank_that_lost_fixes_to_a_late_import_says_it(rank_vars):
    # What a rank imported before the overlay depends on the code it ran: rank 0 may have lost
    # nothing (and its job line then says every fix applied) while rank 1 runs without some.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY") and k not in ("RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO), TORCH_OVERLAY_QUIET="1", **rank_vars)
    proc = subprocess.run([sys.executable, "-c", LATE_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("imported too late") == 1, proc.stderr
    # A child of that rank that inherited the message (a DataLoader worker) stays quiet.
    environ: dict[str, str] = {}
    (line,) = [text for text in proc.stderr.splitlines() if "imported too late" in text]
    message = line[line.index("torch_overlay: ") :]
    once_per_job.pass_on(message, environ)
    assert once_per_job.said_elsewhere(message, {**environ, **rank_vars}, per_rank=True)
    assert not once_per_job.said_elsewhere(message, rank_vars, per_rank=True)


def test_switched_off_nothing_is_said_or_raised():
    # TORCH_OVERLAY=0 turns everything off: the other switches' values are not problems, and
    # strict mode does not stop the job over them.
    proc = _import(
        TORCH_OVERLAY="0", TORCH_OVERLAY_STRICT="1", TORCH_OVERLAY_DISABLE="old-fix-id", TORCH_OVERLAY_QUIET="maybe"
    )
    assert proc.returncode == 0 and "OverlayError" not in proc.stderr, proc.stderr
    assert "torch_overlay" not in proc.stderr, proc.stderr
    # A value of the kill switch itself that is not understood still stops a strict job.
    garbled = _import(TORCH_OVERLAY="of", TORCH_OVERLAY_STRICT="1")
    assert garbled.returncode != 0 and "OverlayError" in garbled.stderr and "TORCH_OVERLAY='of'" in garbled.stderr
