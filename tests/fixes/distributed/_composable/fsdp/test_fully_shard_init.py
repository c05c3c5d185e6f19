# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import re

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.common_utils import run_tests, TestCase
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


if __name__ == "__main__":
    run_tests()
