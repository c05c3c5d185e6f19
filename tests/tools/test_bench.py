"""``./build.sh bench --smoke``: every benchmark runs (tiny sizes), so a moved import fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests._legs import one_leg

REPO = Path(__file__).resolve().parents[2]


@one_leg
def test_every_benchmark_runs_in_smoke_size():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_OVERLAY"}
    env.update(PYTHON=sys.executable, TORCH_VERSION=torch.__version__.split("+")[0])
    proc = subprocess.run(
        [REPO / "build.sh", "bench", "--smoke"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    benchmarks = sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))
    ran = [
        line.split()[1].removeprefix("benchmarks/")
        for line in proc.stdout.splitlines()
        if line.startswith("== benchmarks/")
    ]
    assert ran == benchmarks
    assert "error:" not in proc.stderr
