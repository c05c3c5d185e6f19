# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import json
import os
import subprocess
import sys
import tempfile
import unittest  # torch_overlay: plumbing

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DeviceMesh, distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


WORLD_SIZE = 2
NUM_STEPS = 3


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
    cache_hits = torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": steps, "cache_hits": cache_hits}, f)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def spawn_ranks(out_dir: str) -> None:
    mp.spawn(_rank_main, args=(out_dir,), nprocs=WORLD_SIZE)


@unittest.skipIf(  # torch_overlay: plumbing
    not hasattr(DTensor, "_stable_hash_for_caching"),  # torch_overlay: plumbing
    "torch < 2.12 hashes DTensor inputs by default",  # torch_overlay: plumbing
)  # torch_overlay: plumbing
class TestDTensorCacheKeyPerRank(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def _cache_key(self, rank: int) -> str:
        # The same global DTensor as seen from `rank`: equal specs on every rank.
        mesh = DeviceMesh("cpu", torch.arange(2), _rank=rank)
        local = torch.randn(3, 4)
        dtensor = DTensor.from_local(local, mesh, [Shard(1)], run_check=False)
        return dtensor._stable_hash_for_caching()

    def test_cache_key_differs_between_ranks(self):
        self.assertEqual(self._cache_key(0), self._cache_key(0))
        self.assertNotEqual(self._cache_key(0), self._cache_key(1))

    def test_cache_key_shared_when_compiling_on_one_rank(self):
        # Graphs traced for all ranks at once compute the coordinate at run time.
        # (The flag moved from torch.distributed.config to torch.compiler.config.)
        config = torch.compiler.config
        if not hasattr(config, "compile_on_one_rank"):
            config = torch.distributed.config
        with config.patch(compile_on_one_rank=True):
            self.assertEqual(self._cache_key(0), self._cache_key(1))


class TestCompileCacheSharedAcrossRanks(TestCase):
    def _run_ranks(self, cache_dir: str) -> list:
        # A fresh job each time, as a restarted training job: nothing compiled in
        # memory, only what the shared cache folder holds.
        test_dir, test_file = os.path.split(os.path.abspath(__file__))
        module = os.path.splitext(test_file)[0]
        with tempfile.TemporaryDirectory() as out_dir:
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join(
                    filter(None, [test_dir, os.environ.get("PYTHONPATH")])
                ),
                TORCHINDUCTOR_CACHE_DIR=cache_dir,
                TORCHINDUCTOR_FX_GRAPH_CACHE="1",
                TORCHINDUCTOR_AUTOGRAD_CACHE="1",
                TORCHINDUCTOR_COMPILE_THREADS="1",
                OMP_NUM_THREADS="1",
            )
            code = f"from {module} import spawn_ranks; spawn_ranks({out_dir!r})"
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True
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
        warm_hits = 1  # each rank finds its own graph again: the key is stable
        # torch < 2.12 keys DTensor inputs anew in each process  # torch_overlay: plumbing
        warm_hits = int(hasattr(DTensor, "_stable_hash_for_caching"))  # torch_overlay: plumbing
        with tempfile.TemporaryDirectory() as cache_dir:
            for run in ("cold", "warm"):
                for rank, result in enumerate(self._run_ranks(cache_dir)):
                    hits = warm_hits if run == "warm" else 0
                    self.assertEqual(result["cache_hits"], hits)
                    for i, step in enumerate(result["steps"]):
                        msg = f"{run} cache, rank {rank}, step {i}"
                        eager_loss, eager_grad = step["eager"]
                        loss, grad = step["compiled"]
                        self.assertEqual(
                            loss, eager_loss, atol=1e-5, rtol=1e-5, msg=msg
                        )
                        self.assertEqual(
                            grad, eager_grad, atol=1e-5, rtol=1e-5, msg=msg
                        )


if __name__ == "__main__":
    run_tests()
