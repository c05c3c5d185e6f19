"""Per-step cost of the overlay's pipelining changes for a job that scales its gradients.

With `scale_grads=True` (the default) the fix `pp-scale-grads-accumulation` sets the gradients a
stage holds at the start of each `schedule.step()` aside and adds them back after the step's
division by the number of microbatches: a loop over the stage's parameters each step, and, when
they hold gradients, one in-place add per parameter. The other pipelining fix,
`pp-eval-clears-fsdp-grads`, runs only when the stage metadata is inferred (the first step), not
per step.

This times one training step (`ScheduleGPipe.step` over 4 microbatches of a sum-of-squares loss,
then an SGD step) of one pipeline stage of 8 `Linear` blocks of 256, on a one-rank gloo group
(the stage is first and last: no send or receive, so the step is the schedule and the compute),
CPU, one thread, in three arms: without the overlay (`TORCH_OVERLAY=0`), the overlay with this fix
disabled, and the overlay. The optimizer zeroes the gradients without freeing them
(`zero_grad(set_to_none=False)`), so every step starts with gradients and takes the fix's
set-aside path, its most expensive one. Each arm is a subprocess, the arms alternate over the
rounds, the fastest round (in CPU time of the worker) is kept. Every arm must end with the same
gradients and parameters, bit for bit. `--smoke` runs one round of a few steps: that the benchmark
runs and the gradients match, not what it measures. `--instructions` counts each step's
instructions with callgrind instead (without and with the overlay): on a shared machine CPU time
moves by +-15% between two processes of the same arm, instruction counts do not.
`--instructions --reach` adds an arm that counts reach (`TORCH_OVERLAY_REACH=1`, engine/reach.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _step_arms import arms, compare_arms, instructions, print_arms

ROOT = Path(__file__).resolve().parents[1]
FIX_ID = "pp-scale-grads-accumulation"
SMOKE = "--smoke" in sys.argv[1:]
ROUNDS = 1 if SMOKE else 5
STEPS = int(os.environ.get("BENCH_PP_STEPS", 3 if SMOKE else 100))
N_MICROBATCHES = 4
# --instructions: callgrind's count of the timed steps, (I(long) - I(short)) / (long - short) steps
# per arm, so that the start-up of the process cancels out
INSTRUCTION_STEPS = (5, 105)
ARMS = arms(FIX_ID)


def _worker() -> None:
    sys.path.insert(0, str(ROOT))
    import torch_overlay  # noqa: F401

    import hashlib

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)))
    stage = PipelineStage(model, 0, 1, torch.device("cpu"))

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).sum()

    schedule = ScheduleGPipe(stage, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
    optim = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(32, 256)
    target = torch.randn(32, 256)

    def step() -> None:
        schedule.step(x, target=target)
        optim.step()
        optim.zero_grad(set_to_none=False)

    for _ in range(3):
        step()
    # CPU time of this process: on a shared machine, less of the others' load than wall time
    start = time.process_time()
    for _ in range(STEPS):
        step()
    per_step = (time.process_time() - start) / STEPS
    # The gradients of one more step, and the parameters the steps led to
    schedule.step(x, target=target)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
        digest.update(p.grad.numpy().tobytes())
    dist.destroy_process_group()
    print(json.dumps({"step": per_step, "digest": digest.hexdigest(), "torch": torch.__version__}))


def main() -> None:
    best, version = compare_arms(__file__, ARMS, ROUNDS, SMOKE)
    print_arms(
        f"pipeline step (ScheduleGPipe, {N_MICROBATCHES} microbatches, 8 Linear(256) blocks, 1-rank gloo, 1 thread, "
        f"torch {version}), fastest of {ROUNDS} rounds x {STEPS} steps, CPU time",
        best,
    )


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        _worker()
    elif "--instructions" in sys.argv[1:]:
        instructions(__file__, ARMS, "BENCH_PP_STEPS", INSTRUCTION_STEPS, "pipeline step")
    else:
        main()
