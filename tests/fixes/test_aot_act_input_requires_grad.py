# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.nn as nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module, RowwiseParallel
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, dim)
        self.w2 = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(h)))


class _EmbeddingThenBlock(nn.Module):
    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.block = _Block(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        return h + self.block(h)


@instantiate_parametrized_tests
class TestACTInputRequiresGrad(DTensorTestBase):
    # An AsyncCollectiveTensor that requires grad (the to_local() of an async
    # redistribute) fed to a compiled region must get its gradient, as in eager.
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    @parametrize("backend", ["aot_eager", "inductor"])
    def test_async_redistribute_into_compiled_region(self, backend: str) -> None:
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        torch.manual_seed(0)
        w = torch.randn(8, 4, requires_grad=True)
        v = torch.randn(4, 3, requires_grad=True)

        def fn(h: torch.Tensor) -> torch.Tensor:
            return h @ v

        def run(f):
            w.grad = v.grad = None
            d = DTensor.from_local(w * 2, mesh, [Partial()], run_check=False)
            h = d.redistribute(mesh, [Shard(0)], async_op=True).to_local()
            self.assertIsInstance(h, AsyncCollectiveTensor)
            self.assertTrue(h.requires_grad)
            f(h).sum().backward()
            return w.grad.clone(), v.grad.clone()

        ref = run(fn)
        got = run(torch.compile(fn, backend=backend, fullgraph=True))
        self.assertEqual(got, ref)

    @with_comms
    def test_tp_embedding_into_compiled_block(self) -> None:
        # RowwiseParallel redistributes its output with async_op=True and
        # returns the local tensor, which a compiled block then consumes.
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        torch.manual_seed(0)
        model = _EmbeddingThenBlock()
        ref = copy.deepcopy(model)
        plan = {
            "tok_embeddings": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Shard(1)
            )
        }
        parallelize_module(model, mesh, plan)
        parallelize_module(ref, mesh, plan)
        model.block.compile(backend="inductor", fullgraph=True)
        tokens = torch.randint(0, 16, (2, 4))
        for m in (model, ref):
            m(tokens).sum().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            self.assertEqual(p.grad, q.grad, msg=name)


if __name__ == "__main__":
    run_tests()
