"""Cost of check_replicas relative to one backward of the toy TP MoE block.

Runs two gloo CPU ranks (torch.multiprocessing) and prints one line from rank 0:
the check on the TP MoE block (only the router gate is replicated) and the check
on a module of the same size with every parameter replicated (the worst case:
each element is checksummed), both with grads, against the block's backward.
Medians over a few iterations (``--smoke``: a smaller block, two iterations, seconds). Then the peak memory (RSS) a check adds for one replicated
parameter whose local tensor is transposed (non-contiguous), against the tensor's size.
"""

import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.checks.test_check_replicas import RIGHT, ToyTPMoE  # noqa: E402
from torch_overlay.checks.replicas import check_replicas  # noqa: E402


WORLD_SIZE = 2
# --smoke: that the benchmark runs (seconds), not what it measures. Read at import, so the
# spawned ranks (which re-import this file with the same argv) see it too.
SMOKE = "--smoke" in sys.argv[1:]
WARMUP = 1 if SMOKE else 3
ITERS = 2 if SMOKE else 15
SIZES = {"dim": 16, "num_experts": 4, "hidden": 32} if SMOKE else {"dim": 128, "num_experts": 8, "hidden": 512}
TOKENS_PER_RANK = 16 if SMOKE else 256
PEAK_SIDE = 256 if SMOKE else 4096


def _median_ms(fn: Callable[[], object], setup: Callable[[], object] = lambda: None) -> float:
    times = []
    for i in range(WARMUP + ITERS):
        setup()
        dist.barrier()
        start = time.perf_counter()
        fn()
        if i >= WARMUP:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _replicated_copy(model: nn.Module, mesh) -> nn.Module:
    """The same parameters (full size), all Replicate, with Replicate grads."""
    copy = nn.ParameterList()
    for param in model.parameters():
        full = param.full_tensor().detach()
        replica = nn.Parameter(distribute_tensor(full, mesh, [Replicate()]))
        replica.grad = distribute_tensor(torch.randn_like(full), mesh, [Replicate()])
        copy.append(replica)
    return copy


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _peak_memory_mib(mesh, rows: int = PEAK_SIDE, cols: int = PEAK_SIDE) -> tuple[float, float]:
    """(peak RSS added by a check of one transposed replicated parameter, its size), MiB."""
    local = torch.randn(rows, cols).t()
    param = nn.Parameter(DTensor.from_local(local, mesh, [Replicate()], run_check=False))
    module = nn.ParameterList([param])
    # Warm-up on a small tensor: a full-size one would leave its freed scratch in the heap.
    small = DTensor.from_local(torch.randn(64, 64).t(), mesh, [Replicate()], run_check=False)
    check_replicas(nn.ParameterList([nn.Parameter(small)]), grads=False)
    clear = Path("/proc/self/clear_refs")
    clear.write_text("5")  # resets the peak (VmHWM) to the current RSS
    before = _rss("VmRSS")
    check_replicas(module, grads=False)
    return (_rss("VmHWM") - before) / 2**20, local.numel() * local.element_size() / 2**20


def _run(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    # First, while the heap is fresh: freed buffers of earlier checks would hide the peak.
    peak_mib, size_mib = _peak_memory_mib(mesh)
    model = ToyTPMoE(mesh, RIGHT, **SIZES)
    tokens = torch.randn(TOKENS_PER_RANK, SIZES["dim"], generator=torch.Generator().manual_seed(rank))
    losses = []

    def forward() -> None:
        model.zero_grad(set_to_none=True)
        losses.append(model(tokens).pow(2).sum())

    backward_ms = _median_ms(lambda: losses.pop().backward(), setup=forward)
    forward()
    losses.pop().backward()
    check_ms = _median_ms(lambda: check_replicas(model))
    replicated = _replicated_copy(model, mesh)
    worst_ms = _median_ms(lambda: check_replicas(replicated))
    report = check_replicas(model)
    numel = sum(p.numel() for p in replicated)
    if rank == 0:
        print(
            f"check_replicas: {check_ms:.2f} ms vs backward {backward_ms:.2f} ms "
            f"(ratio {check_ms / backward_ms:.3f}; {report.num_checked} replicated tensor(s), "
            f"{report.num_collectives} all-gather; all {numel} params replicated: "
            f"{worst_ms:.2f} ms, ratio {worst_ms / backward_ms:.3f}; gloo CPU, world size "
            f"{WORLD_SIZE})\n"
            f"check_replicas peak memory: +{peak_mib:.0f} MiB for a transposed {size_mib:.0f} MiB "
            "replicated parameter (RSS, rank 0)",
            flush=True,
        )
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_run, args=(port,), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
