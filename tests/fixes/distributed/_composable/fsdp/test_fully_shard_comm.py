# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    _get_gradient_divide_factors,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

from tests.fixes._torch_gates import before, skip_before


class _FakeGroup:
    """What ``_get_gradient_divide_factors`` reads of a process group."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


class _DivideFactorCheck:
    """Gradients of a model sharded with a custom divide factor, against a
    replica's gradients summed over the data-parallel ranks and divided once."""

    def _check_divide_factor(self, factor: float, layout: str = "fsdp") -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 4)).to(
            self.device_type
        )
        ref_model = copy.deepcopy(model)
        if layout == "fsdp":
            mesh = init_device_mesh(self.device_type, (self.world_size,))
        else:
            # Shard dimension of 1: no reduce-scatter runs; HSDP all-reduces
            # over the ranks, and "one_rank" shards on each rank's own.
            mesh = init_device_mesh(self.device_type, (self.world_size, 1), mesh_dim_names=("replicate", "shard"))
            if layout == "one_rank":
                mesh = mesh["shard"]
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
        # one reduce-scatter (or all-reduce) per FSDP group, no extra collective
        counts = comm_mode.get_comm_counts()
        reduce_scatters = (
            counts[torch.ops.c10d_functional.reduce_scatter_tensor] + counts[torch.ops.c10d._reduce_scatter_base_]
        )
        all_reduces = counts[torch.ops.c10d_functional.all_reduce] + counts[torch.ops.c10d.allreduce_]
        expected_counts = {"fsdp": (3, 0), "hsdp": (0, 3), "one_rank": (0, 0)}[layout]
        self.assertEqual((reduce_scatters, all_reduces), expected_counts)

        ref_model(x).sum().backward()
        for name, ref_param in ref_model.named_parameters():
            grad = ref_param.grad.contiguous()
            if layout != "one_rank":
                dist.all_reduce(grad)
            grad.div_(factor)
            param = model.get_parameter(name)
            self.assertEqual(param.grad.full_tensor(), grad, msg=f"{name}, factor {factor}")


class TestFsdpGlooGradientDivideFactor(_DivideFactorCheck, DTensorTestBase):
    """
    A custom gradient divide factor (``set_gradient_divide_factor``; torchtitan
    sets 1.0 on every module) with the reduce-scatter on Gloo, which has no
    ``PREMUL_SUM``.
    """

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_divide_factor_one_sums(self) -> None:
        self._check_divide_factor(1.0)

    @with_comms
    def test_divide_factor_not_world_size(self) -> None:
        self._check_divide_factor(3.0)

    @with_comms
    def test_divide_factor_world_size_averages(self) -> None:
        self._check_divide_factor(float(self.world_size))


class TestFsdpGlooGradientDivideFactorGuard(_DivideFactorCheck, DTensorTestBase):
    """
    With a reduce-scatter group of one rank (one rank, or HSDP whose shard
    dimension is 1) no reduce-scatter runs, and ``foreach_reduce`` divides the
    gradients by a custom factor itself, on Gloo as on NCCL: they are divided
    once, as without the fix.
    """

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_hsdp_shard_size_one_divides_once(self) -> None:
        for factor in (1.0, 3.0, 4.0):
            self._check_divide_factor(factor, layout="hsdp")

    @with_comms
    def test_one_rank_divides_once(self) -> None:
        for factor in (1.0, 3.0, 4.0):
            self._check_divide_factor(factor, layout="one_rank")


class TestFsdpGlooGradientDivideFactorOps(TestCase):
    """The reduce ops and divide factors FSDP2 picks for a custom factor."""

    def test_factor_one_is_a_plain_sum_on_any_device(self) -> None:
        for device_type in ("cpu", "cuda"):
            self.assertEqual(
                _get_gradient_divide_factors(_FakeGroup(4), None, torch.float32, device_type, 1.0),
                (None, None, dist.ReduceOp.SUM, dist.ReduceOp.SUM),
            )

    def test_cpu_divides_after_a_sum(self) -> None:
        self.assertEqual(
            _get_gradient_divide_factors(_FakeGroup(4), _FakeGroup(2), torch.float32, "cpu", 3.0),
            (None, 3.0, dist.ReduceOp.SUM, dist.ReduceOp.SUM),
        )

    def test_world_size_factor_still_averages_on_cpu(self) -> None:
        self.assertEqual(
            _get_gradient_divide_factors(_FakeGroup(4), None, torch.float32, "cpu", 4.0),
            (None, None, dist.ReduceOp.AVG, dist.ReduceOp.SUM),
        )

    def test_one_rank_group_leaves_the_division_to_foreach_reduce(self) -> None:
        # No reduce-scatter runs, and foreach_reduce divides by the factor:
        # nothing is left to divide after the reduction.
        for reduce_scatter_group in (None, _FakeGroup(1)):
            for all_reduce_group in (None, _FakeGroup(2)):
                self.assertEqual(
                    _get_gradient_divide_factors(reduce_scatter_group, all_reduce_group, torch.float32, "cpu", 3.0),
                    (None, None, dist.ReduceOp.SUM, dist.ReduceOp.SUM),
                )


class _FakeNcclGroup(_FakeGroup):
    """A process group of the given size whose backend is NCCL."""

    def _get_backend_name(self) -> str:
        return "nccl"


class TestNcclBf16PremulSumZero(TestCase):
    """
    A custom gradient divide factor with bf16 gradients reduce-scattered on
    NCCL, whose bf16 ``PREMUL_SUM`` reads a host factor of a power of two as 0.
    """

    def test_bf16_sums_then_divides(self) -> None:
        for factor in (4.0, 8.0, 3.0):
            factors = _get_gradient_divide_factors(_FakeNcclGroup(2), None, torch.bfloat16, "cuda", factor)
            if before("2.14"):
                self.assertEqual(factors, (None, factor, dist.ReduceOp.SUM, dist.ReduceOp.SUM))
            else:
                self.assertEqual(factors[:2], (None, None))
                self.assertTrue(factors[2] == dist.ReduceOp.PREMUL_SUM)

    def test_bf16_with_all_reduce_group_sums_then_divides(self) -> None:
        factors = _get_gradient_divide_factors(_FakeNcclGroup(2), _FakeNcclGroup(2), torch.bfloat16, "cuda", 8.0)
        if before("2.14"):
            self.assertEqual(factors, (None, 8.0, dist.ReduceOp.SUM, dist.ReduceOp.SUM))
        else:
            self.assertTrue(factors[2] == dist.ReduceOp.PREMUL_SUM)

    def test_fp32_keeps_premul_sum(self) -> None:
        factors = _get_gradient_divide_factors(_FakeNcclGroup(2), None, torch.float32, "cuda", 4.0)
        self.assertEqual(factors[:2], (None, None))
        self.assertTrue(factors[2] == dist.ReduceOp.PREMUL_SUM)

    def test_bf16_one_rank_group_leaves_the_division_to_foreach_reduce(self) -> None:
        # No reduce-scatter runs (one rank, or HSDP of shard size 1), and
        # foreach_reduce divides by the factor: no division after it.
        for all_reduce_group in (None, _FakeNcclGroup(2)):
            factors = _get_gradient_divide_factors(_FakeNcclGroup(1), all_reduce_group, torch.bfloat16, "cuda", 4.0)
            self.assertEqual(factors[:2], (None, None))
            self.assertTrue(factors[3] == dist.ReduceOp.SUM)

    def test_bf16_default_and_world_size_factor_average(self) -> None:
        for factor in (None, 2.0):
            factors = _get_gradient_divide_factors(_FakeNcclGroup(2), None, torch.bfloat16, "cuda", factor)
            self.assertEqual(factors[:3], (None, None, dist.ReduceOp.AVG))


class TestFsdpOneRankDivideFactor(TestCase):
    """
    A custom gradient divide factor on one rank, where no reduce-scatter runs
    and ``foreach_reduce`` divides the copied gradients itself, while SUM
    reductions (forced, or for an fp16 reduce dtype) divide by the factor
    before and after the reduction: the factor must apply once.
    """

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def tearDown(self) -> None:
        dist.destroy_process_group()
        super().tearDown()

    def _check_divides_once(self, factor: float, force_sum: bool, reduce_dtype: torch.dtype | None) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        ref_model = copy.deepcopy(model)
        mp_policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
        fully_shard(model[0], mp_policy=mp_policy)
        fully_shard(model, mp_policy=mp_policy)
        for module in (model, model[0]):
            module.set_gradient_divide_factor(factor)
            module.set_force_sum_reduction_for_comms(force_sum)
        x = torch.randn(6, 8)
        model(x).sum().backward()
        ref_model(x).sum().backward()
        tol = {"atol": 1e-3, "rtol": 1e-3} if reduce_dtype == torch.float16 else {}
        for name, ref_param in ref_model.named_parameters():
            grad = model.get_parameter(name).grad.full_tensor()
            self.assertEqual(grad, ref_param.grad / factor, msg=f"{name}, factor {factor}", **tol)

    def test_force_sum_divides_once(self) -> None:
        for factor in (3.0, 4.0):
            self._check_divides_once(factor, force_sum=True, reduce_dtype=None)

    def test_fp16_reduce_dtype_divides_once(self) -> None:
        self._check_divides_once(4.0, force_sum=False, reduce_dtype=torch.float16)


class _ChunkedLossLM(nn.Module):
    """Its forward stops at the final norm; the loss runs ``lm_head`` on each
    chunk of the sequence on its own (chunked cross-entropy)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def chunked_loss(self, h: torch.Tensor) -> torch.Tensor:
        return sum(self.lm_head(chunk).sum() for chunk in h.chunk(2, dim=1))


@skip_before("2.13", "a grouped module's partial forward is supported since 2.13")
class TestFsdpReleaseAllGatherState(TestCase):
    """
    With ``fully_shard([norm, lm_head])`` and ``lm_head`` called on its own
    after the model's forward (chunked loss), the all-gather result of that
    call is released by the end of backward instead of being kept until the
    next forward's first all-gather.
    """

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.mesh = init_device_mesh("cpu", (2,))

    def tearDown(self) -> None:
        dist.destroy_process_group()
        super().tearDown()

    def _sharded_model(self) -> _ChunkedLossLM:
        model = _ChunkedLossLM()
        for layer in model.layers:
            fully_shard(layer, mesh=self.mesh)
        fully_shard([model.norm, model.lm_head], mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        return model

    def _step(self, model: _ChunkedLossLM) -> None:
        comm_ctx = fully_shard.state(model)._comm_ctx
        loss = model.chunked_loss(model(torch.randn(2, 4, 8)))
        # The head's last all-gather result is kept for the next all-gather
        all_gather_state = comm_ctx.all_gather_state
        self.assertIsNotNone(all_gather_state)
        all_gather_output = weakref.ref(all_gather_state.all_gather_result.all_gather_output)
        del all_gather_state
        loss.backward()
        self.assertTrue(all_gather_output() is None, "the all-gather output outlives backward")
        self.assertTrue(comm_ctx.all_gather_state is None, "all_gather_state is set after backward")

    def test_released_after_backward(self) -> None:
        model = self._sharded_model()
        for _ in range(2):
            self._step(model)

    def test_released_without_gradient_sync(self) -> None:
        model = self._sharded_model()
        model.set_requires_gradient_sync(False)
        self._step(model)
        model.set_requires_gradient_sync(True)
        self._step(model)


if __name__ == "__main__":
    run_tests()
