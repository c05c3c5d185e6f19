"""Every verb ``./build.sh help`` lists is run by the test suite, through build.sh, smoke-sized
where the verb is heavy: a verb whose script moved or broke fails here, not in a user's hands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._legs import one_leg

REPO = Path(__file__).resolve().parents[2]
FIX = "dtensor-is-any-true-strategy"  # needed on every supported torch, with a one-process Quick-Test

# Verbs run through build.sh elsewhere in the suite, and where.
ELSEWHERE = {
    "test": ".ci/run (this suite is `./build.sh test`)",
    "lint": ".ci/run (`./build.sh test` starts with it)",
    # Hours on 2 cores: never run whole by the suite; its record and page by tests/tools/test_conformance.py.
    "conformance": "tests/tools/test_conformance.py (the record; the runs themselves are compare's)",
    "bench": "tests/tools/test_bench.py (bench --smoke)",
    "apply": "tests/tools/test_apply.py::test_build_sh_dispatches_apply (apply --check)",
    "python": "tests/tools/test_build_sh_venvs.py",
    # wheel, stage and compare take the same build.sh line as apply (run_py -m torch_overlay.tools).
    "wheel": "tests/tools/test_wheel.py (the same dispatch line as apply)",
    "stage": "tests/tools/test_stage.py (the same dispatch line as apply)",
    "compare": "tests/tools/test_compare.py::test_build_sh_compare",
}


def _build_sh(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_OVERLAY", "TORCH_OVERLAY_DISABLE")}
    env.update(PYTHON=sys.executable, TORCH_VERSION=torch.__version__.split("+")[0])
    return subprocess.run(
        [REPO / "build.sh", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout
    )


def _verbs() -> list[str]:
    text = _build_sh("help").stdout
    return re.findall(r"^  ([a-z]+)\b", text, re.M)


def test_every_verb_is_run_by_the_suite():
    verbs = _verbs()
    assert {"demo", "test", "bench", "status", "verify", "apply", "matrix"} <= set(verbs), verbs
    assert set(verbs) <= {"demo", "status", "verify", "matrix", "help"} | set(ELSEWHERE), set(verbs) - set(ELSEWHERE)


def test_status_json():
    proc = _build_sh("status", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {row["id"]: row["state"] for row in json.loads(proc.stdout)["patches"]}
    assert FIX in rows


@one_leg
def test_demo_of_one_fix_runs_status_and_verify():
    proc = _build_sh("demo", FIX)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== python -m torch_overlay status" in proc.stdout
    assert re.search(rf"^{FIX}\s+fail\s+pass\s+bug present without, fixed with the overlay", proc.stdout, re.M), (
        proc.stdout
    )


@one_leg
def test_matrix_of_the_installed_torch(tmp_path):
    """The matrix of this torch alone, one fix verified (verify --quick), written elsewhere than
    docs/measurements/matrix.md; it fails when a cell contradicts a patch's Affects/Introduced/Applied-Upstream."""
    out = tmp_path / "matrix.md"
    release = torch.__version__.split("+")[0]
    captured = tmp_path / "captured"
    proc = _build_sh("matrix", "--out", str(out), "--ids", FIX, "--captured", str(captured), release, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = out.read_text(encoding="utf-8")
    assert re.search(rf"^\| `{FIX}` \| \*\*bug present\*\* \|", table, re.M), table
    # What the reproducer raised without the overlay, stored for explain's signature test.
    assert FIX in json.loads((captured / f"{release}.json").read_text(encoding="utf-8"))["fixes"]


def test_unknown_verb_fails_with_the_usage():
    proc = _build_sh("benhc")
    assert proc.returncode == 2 and "unknown verb: benhc" in proc.stderr and "Usage:" in proc.stderr
