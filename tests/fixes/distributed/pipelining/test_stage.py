# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


d_hid = 8
batch_size = 8


class _StageMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def _sum_of_squares(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).sum()


class TestPpEvalClearsFsdpGrads(DTensorTestBase):
    """
    Stage metadata inference runs again when a schedule switches between
    ``eval()`` and ``step()``; it must keep the gradients that FSDP stage
    modules accumulated before it.
    """

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    @parametrize("schedule_class", [ScheduleGPipe, Schedule1F1B], name_fn=lambda c: c.__name__)
    def test_eval_between_accumulation_steps(self, schedule_class: type) -> None:
        torch.manual_seed(0)
        n_microbatches = 2
        stage_mods = [_StageMLP(d_hid).to(self.device_type) for _ in range(self.world_size)]
        ref_mods = copy.deepcopy(stage_mods)
        # A (pp, dp) mesh with dp=1, so that each stage is sharded on its own rank
        mesh = init_device_mesh(self.device_type, (self.world_size, 1), mesh_dim_names=("pp", "dp"))
        stage_mod = stage_mods[self.rank]
        fully_shard(stage_mod, mesh=mesh["dp"])
        stage = PipelineStage(
            stage_mod, self.rank, self.world_size, torch.device(self.device_type), group=mesh["pp"].get_group()
        )
        schedule = schedule_class(stage, n_microbatches=n_microbatches, loss_fn=_sum_of_squares, scale_grads=False)

        def run(step: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, d_hid, device=self.device_type)
            target = torch.randn(batch_size, d_hid, device=self.device_type)
            if self.rank == 0:
                step(x, target=target)
            else:
                step(target=target)
            return x, target

        # Two accumulation steps with an evaluation between them
        batches = [run(schedule.step)]
        run(schedule.eval)
        batches.append(run(schedule.step))

        for x, target in batches:
            h = x
            for mod in ref_mods:
                h = mod(h)
            _sum_of_squares(h, target).backward()
        for param, ref_param in zip(stage_mod.parameters(), ref_mods[self.rank].parameters()):
            self.assertIsNotNone(param.grad)
            self.assertEqual(param.grad.full_tensor(), ref_param.grad)


instantiate_parametrized_tests(TestPpEvalClearsFsdpGrads)


if __name__ == "__main__":
    run_tests()
