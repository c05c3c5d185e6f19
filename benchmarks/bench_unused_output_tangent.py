"""Per-call cost of aot-unused-subclass-output-zero-tangent on a compiled region with DTensor outputs.

The fix records, in each forward of a graph with subclass outputs, the layout of every
differentiable subclass output, and checks the gradients of those outputs in the backward. This
measures what that costs on the hot path: a small compiled function (aot_eager, so that the
runtime wrappers dominate) with a Shard(0) DTensor input and two DTensor outputs, called forward
only and forward + backward with both outputs used. One process with the fix applied; rounds
alternate between the fix's two helpers as shipped and no-op stand-ins (the only other code the
fix adds is one truth test per call), so both arms share the process, the caches and the
machine's load. Prints the fastest round's per-call time of each arm and the median of the
per-round ratios (goal: within 2%; on a shared 2-core machine the rounds are noisier than that), then
the helpers alone, timed on the region's outputs (fastest of 15 repeats): the cost the fix adds
per call, without the noise. Fake process group, CPU, one thread.
"""

from __future__ import annotations

import statistics
import sys
import time
import timeit
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch_overlay  # noqa: E402,F401

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  # before runtime_wrappers (import cycle)
import torch.distributed as dist  # noqa: E402
from torch._functorch._aot_autograd import runtime_wrappers  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import distribute_tensor, Shard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

FIX_ID = "aot-unused-subclass-output-zero-tangent"
SMOKE = "--smoke" in sys.argv[1:]  # that the benchmark runs, in seconds, not what it measures
ROUNDS = 1 if SMOKE else 21
CALLS = 5 if SMOKE else 200
REPEAT = 1 if SMOKE else 15


def _no_record(ctx, outs, positions) -> None:
    return None


def _no_coerce(ctx, grads):
    return grads


def main() -> None:
    if not hasattr(runtime_wrappers, "_record_subclass_zeros"):
        print(f"{FIX_ID}: not applied on torch {torch.__version__}; nothing to measure")
        return
    torch.set_num_threads(1)
    shipped = (
        runtime_wrappers._record_subclass_zeros,
        runtime_wrappers._coerce_plain_zero_tangents,
    )
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

    def per_call_us(step) -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            step()
        return (time.perf_counter() - start) / CALLS * 1e6

    for name, step in (("forward", fwd), ("forward+backward", fwd_bwd)):
        for _ in range(2 if SMOKE else 30):
            step()
        with_fix, without = [], []
        for _ in range(ROUNDS):
            runtime_wrappers._record_subclass_zeros = _no_record
            runtime_wrappers._coerce_plain_zero_tangents = _no_coerce
            without.append(per_call_us(step))
            (
                runtime_wrappers._record_subclass_zeros,
                runtime_wrappers._coerce_plain_zero_tangents,
            ) = shipped
            with_fix.append(per_call_us(step))
        ratio = statistics.median(a / b for a, b in zip(with_fix, without))
        print(
            f"{FIX_ID} (torch {torch.__version__}): {name}:"
            f" {min(with_fix):.1f} us/call with the fix,"
            f" {min(without):.1f} us/call without (fastest round);"
            f" median ratio of {ROUNDS} rounds {ratio:.3f}"
        )
    # The helpers alone, on this region's outputs and used-output gradients
    outs = compiled(x)
    grads = [torch.ones_like(o) for o in outs]
    ctx = types.SimpleNamespace()
    record, coerce = shipped
    n = 10 if SMOKE else 2000
    record_us = min(timeit.repeat(lambda: record(ctx, outs, (0, 1)), number=n, repeat=REPEAT))
    record_us *= 1e6 / n
    coerce_us = min(timeit.repeat(lambda: coerce(ctx, grads), number=n, repeat=REPEAT))
    coerce_us *= 1e6 / n
    print(
        f"{FIX_ID}: the helpers alone: recording 2 DTensor outputs {record_us:.2f} us"
        f" per forward, checking 2 DTensor gradients {coerce_us:.2f} us per backward"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
