"""Per-call cost of aot-unused-subclass-output-zero-tangent on a compiled region with DTensor outputs.

The fix records, in each forward of a graph with subclass outputs, the layout of every
differentiable output (so that an unused one can get a DTensor zero gradient). This measures
what that costs on the hot path: a small compiled function (aot_eager, so the runtime wrappers
dominate) with a Shard(0) DTensor input and two DTensor outputs, called forward only and
forward + backward with both outputs used, with the fix and with TORCH_OVERLAY_DISABLE naming
it. The two modes run in child processes, in turn, several rounds; it prints the median
per-call time of each mode and the with/without ratio per round (goal: within 2%). One
process, fake process group, CPU.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX_ID = "aot-unused-subclass-output-zero-tangent"
ROUNDS = 5
CALLS = 400


def measure() -> tuple[float, float]:
    """Median microseconds per forward, and per forward + backward."""
    sys.path.insert(0, str(ROOT))
    import torch_overlay  # noqa: F401

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    x = distribute_tensor(torch.randn(16, 8), mesh, [Shard(0)]).requires_grad_()

    def fn(x):
        return x.sin() * 2, x.cos()

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)

    def fwd() -> None:
        compiled(x)

    def fwd_bwd() -> None:
        a, b = compiled(x)
        (a.to_local().sum() + b.to_local().sum()).backward()

    results = []
    for step in (fwd, fwd_bwd):
        for _ in range(20):
            step()
        times = []
        for _ in range(CALLS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        results.append(statistics.median(times) * 1e6)
    dist.destroy_process_group()
    return results[0], results[1]


def run_child(disable: bool) -> tuple[float, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCH_OVERLAY_DISABLE", None)
    if disable:
        env["TORCH_OVERLAY_DISABLE"] = FIX_ID
    out = subprocess.run(
        [sys.executable, __file__, "--child"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    if "--child" in sys.argv:
        fwd, fwd_bwd = measure()
        print(f"{fwd:.2f} {fwd_bwd:.2f}")
        return
    with_fix, without = [], []
    for _ in range(ROUNDS):
        with_fix.append(run_child(disable=False))
        without.append(run_child(disable=True))
    for i, name in enumerate(("forward", "forward+backward")):
        w = statistics.median(r[i] for r in with_fix)
        wo = statistics.median(r[i] for r in without)
        ratios = ", ".join(f"{a[i] / b[i]:.3f}" for a, b in zip(with_fix, without))
        print(
            f"{FIX_ID}: {name}: {w:.1f} us with the fix, {wo:.1f} us without;"
            f" ratio per round {ratios}"
        )


if __name__ == "__main__":
    main()
