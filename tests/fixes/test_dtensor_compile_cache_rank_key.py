# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.common_utils import run_tests, TestCase


WORLD_SIZE = 2
NUM_STEPS = 3
# Set in the job this file launches for one run of the ranks: where they report.
OUT_DIR_ENV = "DTENSOR_CACHE_RANK_KEY_OUT"


def vocab_parallel_loss(w, x, target):
    logits = x @ w  # Shard(2): each rank holds a slice of the vocabulary
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))


def _rank_main(rank: int, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(out_dir, 'store')}",
        rank=rank,
        world_size=WORLD_SIZE,
    )
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    torch.manual_seed(0)
    w_full = torch.randn(4, 8)
    compiled = torch.compile(vocab_parallel_loss)
    steps = []
    for _ in range(NUM_STEPS):
        x = distribute_tensor(torch.randn(2, 3, 4), mesh, [Replicate()])
        target = distribute_tensor(torch.randint(0, 8, (2, 3)), mesh, [Replicate()])
        step = {}
        for name, fn in (("eager", vocab_parallel_loss), ("compiled", compiled)):
            w = distribute_tensor(w_full, mesh, [Shard(1)]).requires_grad_()
            with loss_parallel():
                loss = fn(w, x, target)
                loss.backward()
            step[name] = (loss.full_tensor().item(), w.grad.full_tensor().tolist())
        steps.append(step)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(steps, f)
    dist.destroy_process_group()


class TestCompileCacheSharedAcrossRanks(TestCase):
    def _run_ranks(self, cache_dir: str) -> list:
        with tempfile.TemporaryDirectory() as out_dir:
            env = dict(
                os.environ,
                TORCHINDUCTOR_CACHE_DIR=cache_dir,
                TORCHINDUCTOR_FX_GRAPH_CACHE="1",
                TORCHINDUCTOR_AUTOGRAD_CACHE="1",
                TORCHINDUCTOR_COMPILE_THREADS="1",
                OMP_NUM_THREADS="1",
                **{OUT_DIR_ENV: out_dir},
            )
            proc = subprocess.run(
                [sys.executable, __file__], env=env, capture_output=True, text=True
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
            results = []
            for rank in range(WORLD_SIZE):
                with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                    results.append(json.load(f))
            return results

    def test_loss_parallel_warm_cache_matches_eager(self):
        # Every rank compiles the same Dynamo graph with DTensor inputs of the same
        # global spec, but tracing bakes each rank's vocabulary offset into its
        # graph: a cache shared by the ranks (the default /tmp/torchinductor_$USER
        # of a node, or a remote cache) must not serve one rank's graph to another.
        with tempfile.TemporaryDirectory() as cache_dir:
            for run in ("cold", "warm"):
                for rank, steps in enumerate(self._run_ranks(cache_dir)):
                    for i, step in enumerate(steps):
                        msg = f"{run} cache, rank {rank}, step {i}"
                        eager_loss, eager_grad = step["eager"]
                        loss, grad = step["compiled"]
                        self.assertEqual(loss, eager_loss, atol=1e-5, rtol=1e-5, msg=msg)
                        self.assertEqual(grad, eager_grad, atol=1e-5, rtol=1e-5, msg=msg)


if __name__ == "__main__":
    if OUT_DIR_ENV in os.environ:
        mp.spawn(_rank_main, args=(os.environ[OUT_DIR_ENV],), nprocs=WORLD_SIZE)
    else:
        run_tests()
