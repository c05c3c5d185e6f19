# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

from tests.fixes._torch_gates import before


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


def _local_grad(param: nn.Parameter) -> torch.Tensor:
    grad = param.grad
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


class TestPpScaleGradsAccumulation(DTensorTestBase):
    """
    Gradient accumulation over several ``step()`` calls without ``zero_grad``
    with the default ``scale_grads=True``: each call must divide only its own
    microbatches' gradients by the number of microbatches, so that the
    accumulated gradient is the sum over the calls of the microbatch means.
    """

    @property
    def world_size(self) -> int:
        return 2

    def _check_accumulation(
        self,
        schedule_class: type,
        stages_per_rank: int,
        n_microbatches: int,
        fsdp: bool = False,
        finalize_gradients: tuple[bool, ...] = (True, True),
    ) -> None:
        torch.manual_seed(0)
        num_stages = stages_per_rank * self.world_size
        stage_mods = [_StageMLP(d_hid).to(self.device_type) for _ in range(num_stages)]
        ref_mods = copy.deepcopy(stage_mods)
        stage_indices = [self.rank + i * self.world_size for i in range(stages_per_rank)]
        group = None
        if fsdp:
            # A (pp, dp) mesh with dp=1, so that each stage is sharded on its own rank
            mesh = init_device_mesh(self.device_type, (self.world_size, 1), mesh_dim_names=("pp", "dp"))
            group = mesh["pp"].get_group()
            for i in stage_indices:
                fully_shard(stage_mods[i], mesh=mesh["dp"])
        stages = [
            PipelineStage(stage_mods[i], i, num_stages, torch.device(self.device_type), group=group)
            for i in stage_indices
        ]
        if stages_per_rank == 1:
            schedule = schedule_class(stages[0], n_microbatches=n_microbatches, loss_fn=_sum_of_squares)
        else:
            schedule = schedule_class(stages, n_microbatches=n_microbatches, loss_fn=_sum_of_squares)

        for finalize in finalize_gradients:
            x = torch.randn(batch_size, d_hid, device=self.device_type)
            target = torch.randn(batch_size, d_hid, device=self.device_type)
            # Finalizing is the default
            step_kwargs = {} if finalize else {"finalize_gradients": False}
            if self.rank == 0:
                schedule.step(x, target=target, **step_kwargs)
            else:
                schedule.step(target=target, **step_kwargs)

            # Eager reference: the microbatch mean of the losses, accumulated over the steps
            for x_mb, target_mb in zip(x.chunk(n_microbatches), target.chunk(n_microbatches)):
                h = x_mb
                for mod in ref_mods:
                    h = mod(h)
                (_sum_of_squares(h, target_mb) / n_microbatches).backward()

        for i in stage_indices:
            for param, ref_param in zip(stage_mods[i].parameters(), ref_mods[i].parameters()):
                self.assertEqual(_local_grad(param), ref_param.grad)

    @with_comms
    @parametrize("schedule_class", [ScheduleGPipe, Schedule1F1B], name_fn=lambda c: c.__name__)
    def test_accumulate_across_steps(self, schedule_class: type) -> None:
        self._check_accumulation(schedule_class, stages_per_rank=1, n_microbatches=2)

    @with_comms
    def test_accumulate_across_steps_interleaved(self) -> None:
        self._check_accumulation(ScheduleInterleaved1F1B, stages_per_rank=2, n_microbatches=4)

    @with_comms
    def test_accumulate_across_steps_fsdp(self) -> None:
        self._check_accumulation(ScheduleGPipe, stages_per_rank=1, n_microbatches=2, fsdp=True)

    # step(finalize_gradients=False) is new in 2.15: no such test on older torch (not even a skipped
    # one, so that a copy of this class made for an older torch has nothing to resolve)
    if not before("2.15"):

        @with_comms
        def test_accumulate_across_steps_fsdp_deferred_finalization(self) -> None:
            # A finalized step, then an accumulation window of two steps that
            # reduces and scales once, at its last step
            self._check_accumulation(
                ScheduleGPipe,
                stages_per_rank=1,
                n_microbatches=2,
                fsdp=True,
                finalize_gradients=(True, False, True),
            )


instantiate_parametrized_tests(TestPpScaleGradsAccumulation)


if __name__ == "__main__":
    run_tests()
