"""The transformers recipe (docs/guide/recipes.md): transformers' own tensor parallelism
(``DistributedConfig(tp_size=2)``) trained with ``clip_grad_norm_`` fails on every supported torch
without the overlay (pytorch#180346: the gradients mix DTensors and plain tensors) and trains with
it, with the first step's loss and gradient norm equal to the unsharded model's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._legs import one_leg

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("transformers_tp_train.py")

if os.environ.get("TORCH_OVERLAY_TEST_LEG") == "full":
    import transformers  # noqa: F401  # CI's full leg installs it (build.sh): never skip there
else:
    pytest.importorskip(
        "transformers", reason="the transformers recipe needs transformers (./build.sh test installs it)"
    )


def _torchrun(tmp_path: Path, *, overlay: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=os.pathsep.join(sys.path))
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    job += [str(SCRIPT), str(tmp_path / "model")]
    if overlay:
        job = [sys.executable, "-m", "torch_overlay", "run", "--", *job]
    else:
        env["TORCH_OVERLAY"] = "0"
    return subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@one_leg
def test_transformers_tp_training_with_clip_grad_norm(tmp_path):
    bare = _torchrun(tmp_path, overlay=False)
    assert bare.returncode != 0, bare.stdout[-2000:]
    assert "got mixed torch.Tensor and DTensor" in bare.stderr, bare.stderr[-3000:]

    fixed = _torchrun(tmp_path, overlay=True)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    records = _records(fixed.stdout)
    steps = [r for r in records if "step" in r]
    (reference,) = [r for r in records if "unsharded_loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert steps[0]["loss"] == pytest.approx(reference["unsharded_loss"], rel=1e-5)
    assert steps[0]["grad_norm"] == pytest.approx(reference["unsharded_grad_norm"], rel=1e-4)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert "clip-grad-norm-mixed-meshes" in fixed.stderr
