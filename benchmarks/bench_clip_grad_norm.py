"""Per-step cost of clip-grad-norm-mixed-meshes on clip_grad_norm_.

The fix groups the gradients by DeviceMesh before `_get_total_norm` and `_clip_grads_with_norm_`
go on as before, so every call pays one pass over the gradients. This times
`torch.nn.utils.clip_grad_norm_` per step on the gradients of a small FSDP2-like model: 4 blocks of
4 weights and 2 biases, each gradient a Shard(0) DTensor on one mesh (the path FSDP2 users take
every step), and the same gradients as plain tensors, in three arms: without the overlay, with the
overlay but this fix disabled (the other fixes change DTensor dispatch too), and with the overlay
(each arm a subprocess, the arms alternating over the rounds, the fastest round kept). With the fix
it also times the case the fix enables: the same model with the last block's gradients on a second
mesh (experts), and the grouping pass the fix adds, alone (on a loaded machine the per-step
times are noisier than the difference). Fake process group (world size 2, rank 0), CPU, one thread. `--smoke` runs the
worker once in this process, a few calls, to check that the benchmark runs, not what it measures.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX_ID = "clip-grad-norm-mixed-meshes"
SMOKE = "--smoke" in sys.argv[1:]
ROUNDS = 5
CALLS = 3 if SMOKE else 100
REPEAT = 1 if SMOKE else 3
ARMS = {
    "without overlay": {"TORCH_OVERLAY": "0"},
    "overlay, fix disabled": {"TORCH_OVERLAY_DISABLE": FIX_ID},
    "overlay": {},
}


def _worker() -> None:
    sys.path.insert(0, str(ROOT))
    import torch_overlay  # noqa: F401

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    expert_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))
    torch.manual_seed(0)
    shapes = [(256, 64), (64, 256), (128, 64), (64, 128), (64,), (128,)] * 4

    def params(mesh_of_block):
        out = []
        for i, shape in enumerate(shapes):
            grad = torch.randn(shape)
            block_mesh = mesh_of_block(i // 6)
            p = torch.nn.Parameter(torch.zeros(shape))
            if block_mesh is not None:
                p = torch.nn.Parameter(distribute_tensor(p.detach(), block_mesh, [Shard(0)]))
                grad = distribute_tensor(grad, block_mesh, [Shard(0)])
            p.grad = grad
            out.append(p)
        return out

    cases = {
        "plain": params(lambda block: None),
        "dtensor_one_mesh": params(lambda block: mesh),
    }
    if hasattr(torch.nn.utils.clip_grad, "_group_tensors_by_device_mesh"):
        cases["dtensor_two_meshes"] = params(lambda block: expert_mesh if block == 3 else mesh)
    result = {}
    group = getattr(torch.nn.utils.clip_grad, "_group_tensors_by_device_mesh", None)
    for name, ps in cases.items():
        if group is not None:
            # the work the fix adds to a call (twice: in the norm and in the clip)
            grads = [p.grad for p in ps]
            call = functools.partial(group, grads)
            t = min(timeit.repeat(call, number=CALLS * 10, repeat=REPEAT))
            result[f"{name}: grouping pass"] = t / (CALLS * 10)
    for name, ps in cases.items():
        # max_norm large: the gradients keep their values over the calls
        step = functools.partial(torch.nn.utils.clip_grad_norm_, ps, 1e9)
        step()
        result[name] = min(timeit.repeat(step, number=CALLS, repeat=REPEAT)) / CALLS
    print(json.dumps(result))


def main() -> None:
    best: dict[str, dict[str, float]] = {arm: {} for arm in ARMS}
    for _ in range(ROUNDS):
        for arm, arm_env in ARMS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("TORCH_OVERLAY", "TORCH_OVERLAY_DISABLE")}
            out = subprocess.run(
                [sys.executable, __file__, "--worker"],
                env={**env, **arm_env},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for name, t in json.loads(out.strip().splitlines()[-1]).items():
                best[arm][name] = min(best[arm].get(name, float("inf")), t)
    print(f"clip_grad_norm_ per step, 24 gradients, fastest of {ROUNDS} rounds x {REPEAT} repeats x {CALLS} calls")
    print(f"  {'case':20s}" + "".join(f"{arm:>24s}" for arm in ARMS) + "   fix / fix disabled")
    for name in best["overlay"]:
        if name.endswith("grouping pass"):
            print(f"  {name:34s} {best['overlay'][name] * 1e6:8.2f} us (the fix's added work per pass)")
            continue
        cells = [best[arm].get(name) for arm in ARMS]
        row = "".join(f"{'fails':>24s}" if t is None else f"{t * 1e6:21.1f} us" for t in cells)
        ratio = "" if cells[1] is None else f"   {cells[2] / cells[1]:.3f}"
        print(f"  {name:20s}{row}{ratio}")


if __name__ == "__main__":
    if "--worker" in sys.argv[1:] or SMOKE:
        _worker()
    else:
        main()
