# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    _get_gradient_divide_factors,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class _FakeGroup:
    """What ``_get_gradient_divide_factors`` reads of a process group."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


class TestFsdpGlooGradientDivideFactor(DTensorTestBase):
    """
    A custom gradient divide factor (``set_gradient_divide_factor``; torchtitan
    sets 1.0 on every module) with the reduce-scatter on Gloo, which has no
    ``PREMUL_SUM``.
    """

    @property
    def world_size(self) -> int:
        return 2

    def _check_divide_factor(self, factor: float) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 4)
        ).to(self.device_type)
        ref_model = copy.deepcopy(model)
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        for index in (0, 2):
            fully_shard(model[index], mesh=mesh)
        fully_shard(model, mesh=mesh)
        for module in model.modules():
            if hasattr(module, "set_gradient_divide_factor"):
                module.set_gradient_divide_factor(factor)

        torch.manual_seed(1 + self.rank)
        x = torch.randn(6, 8, device=self.device_type)
        with CommDebugMode() as comm_mode:
            model(x).sum().backward()
        # one reduce-scatter per FSDP group, no extra collective
        counts = comm_mode.get_comm_counts()
        self.assertEqual(
            counts[torch.ops.c10d_functional.reduce_scatter_tensor]
            + counts[torch.ops.c10d._reduce_scatter_base_],
            3,
        )

        ref_model(x).sum().backward()
        for name, ref_param in ref_model.named_parameters():
            grad = ref_param.grad.contiguous()
            dist.all_reduce(grad)
            grad.div_(factor)
            param = model.get_parameter(name)
            self.assertEqual(param.grad.full_tensor(), grad, msg=name)

    @with_comms
    def test_divide_factor_one_sums(self) -> None:
        self._check_divide_factor(1.0)

    @with_comms
    def test_divide_factor_not_world_size(self) -> None:
        self._check_divide_factor(3.0)

    @with_comms
    def test_divide_factor_world_size_averages(self) -> None:
        self._check_divide_factor(float(self.world_size))


class TestFsdpGlooGradientDivideFactorOps(TestCase):
    """The reduce ops and divide factors FSDP2 picks for a custom factor."""

    def test_factor_one_is_a_plain_sum_on_any_device(self) -> None:
        for device_type in ("cpu", "cuda"):
            self.assertEqual(
                _get_gradient_divide_factors(
                    _FakeGroup(4), None, torch.float32, device_type, 1.0
                ),
                (None, None, dist.ReduceOp.SUM, dist.ReduceOp.SUM),
            )

    def test_cpu_divides_after_a_sum(self) -> None:
        self.assertEqual(
            _get_gradient_divide_factors(
                _FakeGroup(4), _FakeGroup(2), torch.float32, "cpu", 3.0
            ),
            (None, 3.0, dist.ReduceOp.SUM, dist.ReduceOp.SUM),
        )

    def test_world_size_factor_still_averages_on_cpu(self) -> None:
        self.assertEqual(
            _get_gradient_divide_factors(
                _FakeGroup(4), None, torch.float32, "cpu", 4.0
            ),
            (None, None, dist.ReduceOp.AVG, dist.ReduceOp.SUM),
        )


if __name__ == "__main__":
    run_tests()
