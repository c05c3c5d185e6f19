# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import re

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed.fake_pg import FakeStore

from tests.fixes._torch_gates import skip_before


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.embed(ids)))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Sequential(nn.Linear(8, 8))
        self.mlp = nn.Sequential(nn.Linear(8, 8))
        self.mlp[0].weight = self.attn[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


@skip_before("2.12", "FSDP checks for parameters shared across groups since 2.12")
class TestFsdpSharedParamGroupingMessage(TestCase):
    """
    A parameter shared by modules sharded in separate ``fully_shard`` calls is
    rejected at the first forward with a message that names both parameters,
    their groups, and the two groupings that work.
    """

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.mesh = init_device_mesh("cpu", (2,))

    def tearDown(self) -> None:
        dist.destroy_process_group()
        super().tearDown()

    def test_tied_embedding_and_head(self) -> None:
        model = _TiedLM()
        fully_shard(model.embed, mesh=self.mesh)
        fully_shard(model.lm_head, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        msg = (
            "Parameter 'lm_head.weight' is shared with a parameter already managed "
            "by another FSDP group ('embed.weight', in the FSDP group of 'embed'; "
            "'lm_head.weight' is in the FSDP group of 'lm_head'). For shared/tied "
            "parameters, use fully_shard([module_a, module_b]) to place them in the "
            "same FSDP group: pass 'embed' and 'lm_head' to one fully_shard([...]) "
            "call instead of sharding them separately, or apply fully_shard only to "
            "their closest common parent (the root module) and to no module below "
            "it that contains either of them."
        )
        with self.assertRaisesRegex(ValueError, re.escape(msg)):
            model(torch.arange(4))

    def test_head_sharded_apart_from_root(self) -> None:
        # The root's group holds the embedding
        model = _TiedLM()
        fully_shard(model.lm_head, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        msg = (
            "another FSDP group ('embed.weight', in the root module's FSDP group; "
            "'lm_head.weight' is in the FSDP group of 'lm_head')"
        )
        with self.assertRaisesRegex(ValueError, re.escape(msg)):
            model(torch.arange(4))

    def test_shared_within_a_block(self) -> None:
        model = nn.Sequential(_Block(), _Block())
        for block in model:
            fully_shard(block.attn, mesh=self.mesh)
            fully_shard(block.mlp, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        msg = (
            "pass '0.attn.0' and '0.mlp.0' to one fully_shard([...]) call instead "
            "of sharding them separately, or apply fully_shard only to their "
            "closest common parent ('0') and"
        )
        with self.assertRaisesRegex(ValueError, re.escape(msg)):
            model(torch.randn(2, 8))

    def test_grouped_modules_accepted(self) -> None:
        # The grouping the message suggests is accepted
        model = _TiedLM()
        fully_shard([model.embed, model.lm_head], mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        fsdp_state = fully_shard.state(model)
        fsdp_state._lazy_init()
        self.assertIs(model.embed.weight, model.lm_head.weight)


class _PackedLinear(nn.Module):
    """A linear layer beside frozen packed integer weights, as QLoRA's 4-bit layers hold them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        packed = torch.randint(0, 256, (8, 4), dtype=torch.uint8)
        self.packed = nn.Parameter(packed, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.packed.float().mean()


class TestFsdpFrozenNonfloatParam(TestCase):
    """fully_shard of a module with a frozen non-floating-point parameter."""

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (4,))

    def tearDown(self) -> None:
        dist.destroy_process_group()
        super().tearDown()

    def test_frozen_uint8_param(self) -> None:
        model = _PackedLinear()
        fully_shard(model, mesh=self.mesh)
        self.assertIsInstance(model.packed, DTensor)
        self.assertEqual(model.packed.dtype, torch.uint8)
        self.assertFalse(model.packed.requires_grad)
        self.assertTrue(model.lin.weight.requires_grad)

    @parametrize("reshard_after_forward", [True, 2])
    def test_frozen_uint8_param_forward_backward(self, reshard_after_forward) -> None:
        model = _PackedLinear()
        fully_shard(model, mesh=self.mesh, reshard_after_forward=reshard_after_forward)
        model(torch.randn(2, 8)).sum().backward()
        self.assertIsInstance(model.packed, DTensor)
        self.assertFalse(model.packed.requires_grad)
        self.assertIsNone(model.packed.grad)
        self.assertIsNotNone(model.lin.weight.grad)


class TestFsdpFrozenNonfloatParamTraining(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_frozen_uint8_param_gradients(self) -> None:
        torch.manual_seed(0)
        model = _PackedLinear()
        ref_model = copy.deepcopy(model)
        fully_shard(model, mesh=self.build_device_mesh())
        x = torch.randn(2, 8, device=self.device_type)
        model(x).sum().backward()
        ref_model(x).sum().backward()
        self.assertEqual(model.packed.full_tensor(), ref_model.packed)
        for name in ("weight", "bias"):
            grad = getattr(model.lin, name).grad
            self.assertEqual(grad.full_tensor(), getattr(ref_model.lin, name).grad)


instantiate_parametrized_tests(TestFsdpFrozenNonfloatParam)


if __name__ == "__main__":
    run_tests()
