"""What the per-step benchmarks share (bench_fsdp_step.py, bench_pp_step.py): a worker process per arm
(no overlay, the fix disabled, the overlay) that times a training step, run in turn; and the
callgrind count of one step, (I(long) - I(short)) / (long - short) steps per arm, so that the
process's start-up cancels out (its count moves by up to 17 M of 10 G between runs).

A benchmark's worker prints one JSON line: ``{"step": seconds, "digest": ..., "torch": version}``; the
digest (its gradients and parameters) must be the same in every arm.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

__all__ = ["arms", "compare_arms", "instructions", "print_arms"]


def arms(fix_id: str) -> dict[str, dict[str, str]]:
    """The three arms: what each sets in the worker's environment."""
    return {"no overlay": {"TORCH_OVERLAY": "0"}, "fix disabled": {"TORCH_OVERLAY_DISABLE": fix_id}, "overlay": {}}


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("TORCH_OVERLAY", "TORCH_OVERLAY_DISABLE")}


def _count(script: str, arm_env: dict[str, str], steps_var: str, steps: int) -> int:
    env = _clean_env()
    fixed = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.update(arm_env, **{steps_var: str(steps)}, **fixed)
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, script, "--worker"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    assert found, out.stderr[-2000:]
    return int(found.group(1))


def instructions(
    script: str, arm_envs: dict[str, dict[str, str]], steps_var: str, steps: tuple[int, int], title: str
) -> None:
    """Print the callgrind instructions per step of the arms without and with the overlay; with
    ``--reach`` on the command line, also of the overlay counting reach (``TORCH_OVERLAY_REACH=1``)."""
    short, long = steps
    envs = {"no overlay": arm_envs["no overlay"], "overlay": arm_envs["overlay"]}
    if "--reach" in sys.argv[1:]:
        envs["overlay, reach"] = {**arm_envs["overlay"], "TORCH_OVERLAY_REACH": "1"}
    per_step = {
        arm: (_count(script, env, steps_var, long) - _count(script, env, steps_var, short)) / (long - short)
        for arm, env in envs.items()
    }
    print(f"{title}, callgrind instructions per step ({long} - {short} steps, PYTHONHASHSEED=0, 1 thread)")
    for arm, count in per_step.items():
        print(f"  {arm:16s}{count / 1e6:10.2f} M")
    for arm in per_step:
        if arm != "no overlay":
            print(f"  {arm} / no overlay: {per_step[arm] / per_step['no overlay']:.4f}")


def compare_arms(
    script: str, arm_envs: dict[str, dict[str, str]], rounds: int, smoke: bool
) -> tuple[dict[str, float], str]:
    """The fastest step of each arm over ``rounds`` rounds (the arms in turn), and the torch version;
    exits when the arms' gradients or parameters differ."""
    best: dict[str, float] = {}
    digests: dict[str, set[str]] = {arm: set() for arm in arm_envs}
    version = ""
    for _ in range(rounds):
        for arm, arm_env in arm_envs.items():
            out = subprocess.run(
                [sys.executable, script, "--worker", *(["--smoke"] if smoke else [])],
                env={**_clean_env(), **arm_env},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            best[arm] = min(best.get(arm, float("inf")), result["step"])
            digests[arm].add(result["digest"])
            version = result["torch"]
    if len(set().union(*digests.values())) != 1:
        sys.exit(f"the arms' gradients or parameters differ: {digests}")
    return best, version


def print_arms(title: str, best: dict[str, float]) -> None:
    """The table of ``compare_arms``: each arm's fastest step, and its ratio to the arm without the overlay."""
    print(title)
    for arm, seconds in best.items():
        print(f"  {arm:14s}{seconds * 1e3:10.3f} ms")
    for arm in ("fix disabled", "overlay"):
        print(f"  {arm} / no overlay: {best[arm] / best['no overlay']:.4f}")
    print("  gradients and parameters bitwise equal in every arm")
