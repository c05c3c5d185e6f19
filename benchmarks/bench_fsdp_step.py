"""Per-step cost of the overlay's FSDP2 changes for a job that does not opt in to unused parameters.

Without `set_reduce_scatter_unused_params(True)` the fix still looks, in each FSDP2 pre-backward
and in the final callback, for modules that ran forward but whose outputs the backward does not
reach, to warn before the collective that would hang: every forward records its output's autograd
node, and each backward checks each module once (one `_will_engine_execute_node` call for a module
whose pre-backward has not run yet, none when the backward runs in reverse forward order).

The other FSDP2 fixes the installed torch needs run in the same post-backward
(fsdp-accumulated-grad-dtype, fsdp-accumulated-grad-unused-unit on 2.11-2.14).

This times one training step (forward, backward, SGD step) of a small FSDP2 model, 8 `Linear`
blocks of 256 and the root, each `fully_shard`ed, every block used, on a one-rank gloo group
(the collectives are local copies, so the step is the hooks and the compute, and the gradients are
deterministic: a fake process group leaves collective outputs unwritten), CPU, one thread, in three
arms: without the overlay (`TORCH_OVERLAY=0`), the overlay with this fix disabled, and the overlay.
Each arm is a subprocess, the arms alternate over the rounds, the fastest round (in CPU time of
the worker) is kept. Every arm
must end with the same gradients, bit for bit, and warn about nothing (a warning is an error in
the worker). `--smoke` runs one round of a few steps: that the benchmark runs and the gradients
match, not what it measures. `--instructions` counts each step's instructions with callgrind instead
(without and with the overlay): on a shared machine CPU time moves by +-15% between two processes of
the same arm, instruction counts do not. `--instructions --reach` adds an arm that counts reach
(`TORCH_OVERLAY_REACH=1`, engine/reach.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _step_arms import arms, compare_arms, instructions, print_arms

ROOT = Path(__file__).resolve().parents[1]
FIX_ID = "fsdp-unused-params-backward-order"
SMOKE = "--smoke" in sys.argv[1:]
ROUNDS = 1 if SMOKE else 5
STEPS = int(os.environ.get("BENCH_FSDP_STEPS", 3 if SMOKE else 100))
# --instructions: callgrind's count of the timed steps, (I(long) - I(short)) / (long - short) steps
# per arm, where CPU time moves by +-15% between processes of one arm on this machine. The count of
# a whole process moves too, by up to 17 M of its 10 G (start-up, not the steps): spread over 100
# steps that is 0.17 M, 0.5% of a step (over 20 steps it was 2.7%).
INSTRUCTION_STEPS = (5, 105)
ARMS = arms(FIX_ID)


def _worker() -> None:
    sys.path.insert(0, str(ROOT))
    import torch_overlay  # noqa: F401

    import hashlib
    import warnings

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("error", message=r".*set_reduce_scatter_unused_params")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256)

    def step() -> None:
        model(x).square().mean().backward()
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
    model(x).square().mean().backward()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().to_local().numpy().tobytes())
        digest.update(p.grad.to_local().numpy().tobytes())
    dist.destroy_process_group()
    print(json.dumps({"step": per_step, "digest": digest.hexdigest(), "torch": torch.__version__}))


def main() -> None:
    best, version = compare_arms(__file__, ARMS, ROUNDS, SMOKE)
    print_arms(
        f"FSDP2 step (8 Linear(256) blocks + root, 1-rank gloo, 1 thread, torch {version}), fastest of {ROUNDS} rounds x {STEPS} steps, CPU time",
        best,
    )


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        _worker()
    elif "--instructions" in sys.argv[1:]:
        instructions(__file__, ARMS, "BENCH_FSDP_STEPS", INSTRUCTION_STEPS, "FSDP2 step")
    else:
        main()
