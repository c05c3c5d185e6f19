"""Per-call cost of aot-subclass-outputs-view-replay's replay, static and symbolic arguments.

A compiled region whose DTensor output is a view of another output or of an input regenerates
that view at run time by replaying the recorded subclass-level view ops on the runtime base. With
symbolic arguments (dynamic shapes) each call also evaluates their expressions with the base's
sizes. This times, in one process (fake process group, CPU, one thread), the replay alone against
the view op it replays (fastest of 15 repeats), and a whole compiled call that regenerates a
static and a symbolic view, so the replay's share of a call can be read off.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch_overlay  # noqa: E402,F401

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  # before functional_utils (import cycle)
import torch.distributed as dist  # noqa: E402
from torch._functorch._aot_autograd.functional_utils import (  # noqa: E402
    SubclassViewReplay,
)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import distribute_tensor, Shard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

FIX_ID = "aot-subclass-outputs-view-replay"
SMOKE = "--smoke" in sys.argv[1:]  # that the benchmark runs, in seconds, not what it measures
CALLS = 5 if SMOKE else 500
REPEAT = 1 if SMOKE else 15


def best_us(fn, calls: int = CALLS) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=REPEAT)) / calls * 1e6


def main() -> None:
    if not hasattr(SubclassViewReplay, "replay"):
        print(f"{FIX_ID}: not applied on torch {torch.__version__}; nothing to measure")
        return
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    x = distribute_tensor(torch.randn(8, 12), mesh, [Shard(0)]).requires_grad_()

    def region(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = t * 2
        return y, y[:, :1], y[:, : y.shape[1] // 2]

    captured: list[SubclassViewReplay] = []
    record = SubclassViewReplay.record.__func__

    def spy(cls, traced_output, base):  # keep what the compile records
        out = record(cls, traced_output, base)
        if out is not None:
            captured.append(out)
        return out

    SubclassViewReplay.record = classmethod(spy)
    try:
        compiled = torch.compile(region, backend="aot_eager", fullgraph=True, dynamic=True)
        compiled(x)
    finally:
        SubclassViewReplay.record = classmethod(record)
    static, symbolic = sorted(captured, key=lambda r: len(r.size_symbols))[:2]
    y = (x * 2).detach()
    print(f"{FIX_ID} on torch {torch.__version__} (fake process group, CPU, 1 thread)")
    print(f"  y[:, :1]                  as an op: {best_us(lambda: y[:, :1]):7.1f} us")
    print(f"                            replayed: {best_us(lambda: static.replay(y)):7.1f} us")
    print(f"  y[:, : y.shape[1] // 2]   as an op: {best_us(lambda: y[:, :6]):7.1f} us")
    print(f"                            replayed: {best_us(lambda: symbolic.replay(y)):7.1f} us")
    print(f"  whole compiled call (both views):   {best_us(lambda: compiled(x), CALLS):7.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
